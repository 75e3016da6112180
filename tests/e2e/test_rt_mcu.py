"""port-rt on a Cortex-M4 with no OS (issue 13): `port compile configs/digits_m4.yaml --emit-c` (the digits CNN at
batch 1, planned for the modeled cortex-m4f device within 184 KiB) is built freestanding with the bundle and 16
real digits compiled in (`make port-rt-m4`: arm-none-eabi-gcc, newlib, no malloc) and run on the MPS2 AN386
board under qemu-system-arm. Its losses equal the host's portable build bit for bit, and the program fits the
STM32F429 it was planned for (192 KB contiguous SRAM for data and arena, 2 MB flash). Needs Debian's
gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm (`.ci/run` installs them); skipped without."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from buildlock import make

pytestmark = pytest.mark.slow      # cross builds and emulators: the slow tier (make test-all, .ci/run)

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "apt-get install -y gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"
STEPS = 10


def test_cortex_m4_trains_like_the_host(tmp_path):
    missing = [t for t in ("arm-none-eabi-gcc", "qemu-system-arm", "arm-none-eabi-size") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: {INSTALL}")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = tmp_path / "m4"
    r = subprocess.run([sys.executable, "-m", "port.cli", "compile", "configs/digits_m4.yaml", "-o", str(out),
                        "--emit-c"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "paged 0" in r.stdout and "placement: mcu" in r.stdout
    r = make("port-rt-m4", f"M4_BUNDLE={out}", "port-rt-portable", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    text, data, bss = (int(v) for v in r.stdout.strip().splitlines()[-1].split()[:3])
    assert data + bss <= 192 * 1024 and text + data <= 2 * 1024 * 1024, (text, data, bss)
    m4 = subprocess.run(["qemu-system-arm", "-M", "mps2-an386", "-nographic", "-semihosting-config",
                         "enable=on,target=native", "-kernel", str(out / "port-rt-m4.elf")],
                        capture_output=True, text=True, timeout=600)
    assert m4.returncode == 0, m4.stdout[-2000:] + m4.stderr[-2000:]
    got = [ln.split()[3] for ln in m4.stdout.splitlines() if ln.startswith("step ")]
    host = subprocess.run([str(ROOT / "kernels" / "build" / "port-rt-portable"), "train", str(out / "digits_m4.portrt"),
                           "--data", str(out / "train.portdata"), "--steps", str(STEPS), "--threads", "1",
                           "--gemm", "vendored"], capture_output=True, text=True, timeout=600)
    assert host.returncode == 0, host.stderr[-2000:]
    ref = [ln.split()[3] for ln in host.stdout.splitlines() if ln.startswith("step ")]
    assert len(got) == STEPS and got == ref, list(zip(ref, got))
