"""The `port` command line for the CLI tests: in a fresh process (`port_cli`: what a user runs; each command keeps
at least one such test, for its exit codes and its process-wide effects: signals, umask) or in this process
(`port_inprocess`: port.cli.run, the same code and exit codes without a new interpreter, torch import and capture,
a few seconds a call)."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def env(columns: int = 200, **more_env: str) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS=str(columns), **more_env)


def port_cli(*args, cwd, timeout=600, umask=None, columns=200, **more_env: str) -> subprocess.CompletedProcess:
    """`python -m port.cli ARGS` in ``cwd`` (a fresh process; ``more_env``: variables set for it)."""
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([sys.executable, "-m", "port.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env(columns, **more_env), timeout=timeout, preexec_fn=pre)


def port_inprocess(*args, cwd, umask=None, columns=200) -> subprocess.CompletedProcess:
    """port.cli.run(ARGS) in ``cwd``, stdout and stderr captured, ``cwd`` first on sys.path as under `python -m`
    (a config's model module next to it); the working directory, sys.path, umask, COLUMNS and the C kernels'
    thread count are restored afterwards."""
    from port.cli import run
    from port.exec import capi
    out, err = io.StringIO(), io.StringIO()
    old_cwd, old_cols, threads = os.getcwd(), os.environ.get("COLUMNS"), capi.get_num_threads()
    old_mask = os.umask(umask) if umask is not None else None
    os.environ["COLUMNS"] = str(columns)
    sys.path.insert(0, str(cwd))
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = run([str(a) for a in args])
    finally:
        os.chdir(old_cwd)
        sys.path.remove(str(cwd))
        capi.set_num_threads(threads)
        if old_mask is not None:
            os.umask(old_mask)
        if old_cols is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old_cols
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    return r
