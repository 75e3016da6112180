"""Shared helpers for the kernel tests.

PORT_KERNELS_QUICK=1 reduces the parametrisation (used by `make test-asan`).
"""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from port.exec import capi  # noqa: E402

capi.configure_openmp_env()  # PORT_OMP_WAIT_POLICY, if set and torch is not imported yet

import torch  # noqa: E402

QUICK = os.environ.get("PORT_KERNELS_QUICK") == "1"


def close(ours, ref, atol=1e-4, rtol=1e-4, what=""):
    """|ours - ref| <= atol + rtol*|ref| elementwise (ref is the float64 reference)."""
    ours = ours.detach().double()
    ref = ref.detach().double()
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} vs {tuple(ref.shape)}"
    err = (ours - ref).abs()
    bound = atol + rtol * ref.abs()
    bad = err > bound
    assert not bad.any(), (f"{what}: max err {err.max().item():.3g}, "
                           f"{int(bad.sum())} of {bad.numel()} elements out of tolerance")


def quick_subset(cases, every):
    """Every `every`-th case under QUICK, all otherwise."""
    return cases[::every] if QUICK else cases


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def K():
    """The checked tensor wrappers (tests/kernels/checked.py), with the GEMM backend at 'blas' (tests may set
    another), and the process's own setting back afterwards: the tests that follow on this xdist worker run the
    GEMM a user's process runs (a profile records it in its kernels build id, so a shared fixture's profile
    measured on the other worker would read as stale otherwise)."""
    import checked
    prev = capi.get_gemm_backend()
    capi.set_gemm_backend("blas")
    yield checked
    capi.set_gemm_backend(prev)
