"""What every step of the pipeline shares: where profiles live, the names printed, the echo callback and the
Interrupted exception."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Callable

PROFILE_DIR = Path("profiles")       # relative to the working directory
KEEP_EVERYTHING = "keep-everything peak"
PROFILE_MAX_TIME_S = 600.0           # time budget of a profile measured implicitly (solve/train)

Echo = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


class Interrupted(BaseException):
    """SIGINT or SIGTERM stopped a command (after ``port train`` wrote its checkpoint). A BaseException, so
    no ``except Exception`` on the way swallows it; the CLI exits with 128 + the signal number."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
