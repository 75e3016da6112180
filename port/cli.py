"""The `port` command line (typer + rich). Commands live in port/cli_<name>.py modules, each exposing
``register(app)``; nothing here imports torch or a solver, so `port --help` starts fast.

Exit codes: 0 success, 2 bad input (a clear message, no traceback), 1 internal error.
"""
from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(
    name="port",
    help="PORT: train neural networks on-device under a memory budget.\n\n"
         "Pipeline: trace -> profile -> solve -> train. Start with `port inspect configs/default.yaml`.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """PORT: train neural networks on-device under a memory budget."""


# command modules, in the order they appear in --help
COMMAND_MODULES = ("cli_inspect", "cli_profile", "cli_solve", "cli_train", "cli_demo")

for _name in COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"port.{_name}")
    except ModuleNotFoundError as _e:  # a command module not written yet
        if _e.name != f"port.{_name}":
            raise
        continue
    _mod.register(app)


def main() -> None:
    from .errors import PortError
    try:
        app(standalone_mode=False)
    except PortError as e:
        _err(str(e))
        sys.exit(2)
    except KeyError as e:  # unknown model names etc. are raised as KeyError with a message
        _err(str(e.args[0]) if e.args else str(e))
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        _err("aborted")
        sys.exit(1)
    except typer.TyperException as e:  # usage errors: bad option, missing argument (exit 2)
        show = getattr(e, "show", None)
        if show is not None:
            show()
        else:
            _err(str(e))
        sys.exit(getattr(e, "exit_code", 2) or 2)
    sys.exit(0)


def _err(msg: str) -> None:
    from rich.console import Console
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {msg}", markup=True)


if __name__ == "__main__":
    main()
