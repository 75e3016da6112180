"""bench/_results.busy_process (the loaded phases' background load) ends with its parent: a benchmark killed
mid-run must not leave a busy loop beside every later measurement."""
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_busy_process_ends_with_its_parent():
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time; sys.path.insert(0, {str(BENCH)!r}); "
         "from _results import busy_process; print(busy_process().pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    try:
        os.kill(pid, 0)                       # running while its parent lives
        parent.kill()                         # SIGKILL: no finally, no atexit in the parent
        parent.wait()
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        raise AssertionError(f"busy loop {pid} still running 20 s after its parent was killed")
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
