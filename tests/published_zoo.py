"""bench/published.py (the coverage list and its zoo import: torchvision's two op schemas defined before the import)
as the module `published`, loaded once per process for every test that builds a published model."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "bench" / "published.py"


def published():
    """The module bench/published.py, registered as sys.modules["published"] (its dataclasses need the name)."""
    if "published" not in sys.modules:
        spec = importlib.util.spec_from_file_location("published", _PATH)
        sys.modules["published"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["published"])
    return sys.modules["published"]
