import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/reference.py
os.environ.setdefault("OMP_NUM_THREADS", "2")

# Before torch loads its OpenMP runtime: passive waiting (a spinning pool on an oversubscribed 2-core
# machine makes every parallel region 100x slower; see port/_native.py).
import port  # noqa: E402,F401
