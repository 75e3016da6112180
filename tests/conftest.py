import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/reference.py
os.environ.setdefault("OMP_NUM_THREADS", "2")
