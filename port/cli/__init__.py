"""The `port` command line (typer). One thin module per command (port/cli/<command>.py, each exposing
``register(app)``); the work is done by port.pipeline. Nothing here imports torch, numpy, pydantic or a solver,
so `port --help` starts fast.

Exit codes: 0 success; 2 bad input (the message names the file, key, value and fix; no traceback);
1 internal error (SolverError, ProgramError, KernelError or any unexpected exception: "please report", with
the details); 130 / 143 interrupted by SIGINT / SIGTERM (`port train` writes a checkpoint first).
"""
from __future__ import annotations

import importlib
import signal
import sys
import traceback
from typing import Optional, Sequence

import typer

app = typer.Typer(
    name="port",
    help="PORT: train neural networks on-device under a memory budget.\n\n"
         "Pipeline: trace -> profile -> solve -> train. Start with `port inspect configs/default.yaml`.\n\n"
         "Profiles live at profiles/<device>/<config name>.json under the working directory (--profile PATH "
         "overrides). Budgets: bytes, 64MB, 1.5GiB or NN% of the keep-everything peak.\n\n"
         "Exit codes: 0 ok, 1 internal error, 2 bad input, 130/143 interrupted.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """PORT: train neural networks on-device under a memory budget."""


# command modules, in the order they appear in --help
COMMAND_MODULES = ("inspect", "profile", "solve", "train", "compile", "federate", "demo")

for _name in COMMAND_MODULES:
    importlib.import_module(f"port.cli.{_name}").register(app)

def _is_internal(e: BaseException) -> bool:
    """Internal failures (exit 1, "please report"): port.errors.InternalError (SolverError, ProgramError,
    KernelError)."""
    from port.errors import InternalError
    return isinstance(e, InternalError)


def _on_sigterm(signum: int, _frame) -> None:
    from port.pipeline import Interrupted
    raise Interrupted(signum, "terminated (SIGTERM)")


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run the CLI and exit with PORT's exit codes (see the module docstring)."""
    sys.exit(run(argv))


def run(argv: Optional[Sequence[str]] = None) -> int:
    """The CLI as a function: returns the exit code instead of exiting."""
    from port.errors import PortError
    from port.pipeline import Interrupted

    old = None
    try:
        old = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:       # not the main thread
        pass
    try:
        rc = app(args=list(argv) if argv is not None else None, standalone_mode=False)
        if rc == 130:                             # typer turns KeyboardInterrupt into Exit(130)
            _err("interrupted (SIGINT)")
        return rc if isinstance(rc, int) else 0
    except Interrupted as e:
        _err(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        _err("interrupted (SIGINT)")
        return 130
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        _err("aborted")
        return 1
    except _usage_errors() as e:               # usage errors: bad option, missing argument (exit 2)
        show = getattr(e, "show", None)
        if show is not None:
            show()
        else:
            _err(str(e))
        return getattr(e, "exit_code", 2) or 2
    except PortError as e:
        if _is_internal(e):
            return _internal(e)
        _err(str(e))
        return 2
    except OSError as e:
        if getattr(e, "filename", None) is not None:   # a file the user named cannot be read or written
            _err(os_error_message(e))
            return 2
        return _internal(e)
    except Exception as e:  # noqa: BLE001 - anything else is a bug (or a bug in the user's own model code)
        return _internal(e)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def _usage_errors() -> tuple:
    """The exception classes of command-line usage errors: typer's own (typer >= 0.22 vendors click) and
    click's (older typer, e.g. 0.20, which flwr 1.41 pins when the `federated` extra is installed)."""
    out = [c for c in (getattr(typer, "TyperException", None),) if c is not None]
    try:
        import click
        out.append(click.ClickException)
    except ImportError:
        pass
    return tuple(out)


def os_error_message(e: OSError) -> str:
    """'<path>: <what>; <fix>' for an OSError on a path the user gave (or a folder PORT made under it)."""
    import errno
    fixes = {
        errno.ENOTDIR: "a part of this path is a file, not a folder: choose another location",
        errno.EEXIST: "it exists and is not a folder: choose another location (or move the file away)",
        errno.EACCES: "permission denied: choose a location you can write to (or fix its permissions)",
        errno.EPERM: "not permitted: choose a location you can write to (or fix its permissions)",
        errno.EROFS: "read-only file system: choose a writable location",
        errno.EISDIR: "it is a folder: give a file path",
        errno.ENOENT: "no such file or folder: check the path",
        errno.ENOSPC: "no space left on the device: free some space or choose another location",
    }
    name = e.filename if e.filename2 is None else f"{e.filename} -> {e.filename2}"
    fix = fixes.get(e.errno)
    return f"{name}: {e.strerror or e}" + (f" ({fix})" if fix else "")


def _internal(e: BaseException) -> int:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    sys.stderr.write(tb)
    _err(f"internal error: {type(e).__name__}: {e}\nThis is a bug in PORT (or in the model's own code, if the "
         f"traceback above ends there): please report it with the command line, the config and the traceback.")
    return 1


def _err(msg: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(msg)}", markup=True)


if __name__ == "__main__":
    main()
