"""port-rt on another ISA (issue 13): the portable flavour (vendored GEMM, -ffp-contract=off) built for this host
and cross-built for aarch64 Linux (`make port-rt-portable port-rt-aarch64`, run under qemu-aarch64) trains the
same bundle to the same losses, bit for bit. Needs Debian's gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and
qemu-user (`.ci/run` installs them); skipped without them."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import port
from port import models
from port.exec.bundle import write_data

from buildlock import make
from published_zoo import published  # tests/published_zoo.py: bench/published.py as a module

pytestmark = pytest.mark.slow      # cross builds and emulators: the slow tier (make test-all, .ci/run)

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "apt-get install -y gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"


@pytest.fixture(scope="module")
def binaries():
    missing = [t for t in ("aarch64-linux-gnu-gcc", "qemu-aarch64") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: {INSTALL}")
    r = make("port-rt-portable", "port-rt-aarch64")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return ROOT / "kernels" / "build" / "port-rt-portable", ROOT / "kernels" / "build" / "port-rt-aarch64"


def _losses(cmd, bundle, data, steps):
    r = subprocess.run([*cmd, "train", str(bundle), "--data", str(data), "--steps", str(steps), "--threads", "1",
                        "--gemm", "vendored"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return [ln.split()[3] for ln in r.stdout.splitlines() if ln.startswith("step ")]


# ResNet-18 at batch 1: its last stages' convolutions are narrow products (4x4 and 8x8 maps), which the host's
# AVX-512 narrow GEMM kernels run (kernels/src/gemm_skinny.c) and the aarch64 build's blocked GEMM
@pytest.mark.parametrize("name,shape,batch,steps", [("digits_cnn", (1, 8, 8), 32, 40), ("resnet8", (3, 32, 32), 2, 3),
                                                    ("resnet18", (3, 32, 32), 1, 2)])
def test_aarch64_build_equals_host_build(binaries, tmp_path, name, shape, batch, steps):
    host, arm = binaries
    torch.manual_seed(0)
    x, y = torch.randn(32, *shape), torch.randint(0, 10, (32,))
    tr = port.Trainer(models.get(name, seed=0), x[:batch], optimizer=port.optim.SGD(0.05, momentum=0.9))
    port.compile(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    a = _losses([str(host)], tmp_path / "m.portrt", tmp_path / "d.portdata", steps)
    b = _losses(["qemu-aarch64", str(arm)], tmp_path / "m.portrt", tmp_path / "d.portdata", steps)
    # "%.9g": every float32 bit. An aarch64 build with FMA contraction (-ffp-contract=fast) differed from step 30
    # on configs/default.yaml's digits CNN (1.299788 vs 1.29978788): the portable flavour turns it off
    assert len(a) == steps and a == b, list(zip(a, b))


def test_aarch64_random_ops_and_attention_equal_host(binaries, tmp_path):
    """Dropout, drop path and attention with masks, grouped-query heads and dropout (issue 54): the generator is
    integer arithmetic, so the aarch64 build draws the host's masks and trains to its losses bit for bit."""
    from test_rt import _RngAttn
    host, arm = binaries
    torch.manual_seed(0)
    x, y = torch.randn(16, 6, 12), torch.randint(0, 10, (16,))
    tr = port.Trainer(_RngAttn(), x[:4], optimizer=port.optim.SGD(0.05, momentum=0.9), seed=3)
    port.compile(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    a = _losses([str(host)], tmp_path / "m.portrt", tmp_path / "d.portdata", 4)
    b = _losses(["qemu-aarch64", str(arm)], tmp_path / "m.portrt", tmp_path / "d.portdata", 4)
    assert len(a) == 4 and a == b, list(zip(a, b))


@pytest.mark.parametrize("name", ["hand.se_cat_net", "timm.vit_tiny_patch16_224", "hf.llama_lm"])
def test_aarch64_build_trains_published_models_like_the_host(binaries, tmp_path, name):
    """Issue 54's three on aarch64: a CNN with squeeze-excitation and torch.cat, timm's ViT-tiny and Hugging
    Face's Llama (rotary tables and the causal mask folded at capture, grouped-query attention) compile, and the
    portable build under qemu-aarch64 trains them to the host build's losses bit for bit."""
    P = published()
    zoo = P.import_zoo()
    spec = P.MODELS[name]
    if spec.family in ("timm", "transformers") and spec.family not in zoo:
        pytest.skip(f"{spec.family} does not import here")
    x, y = P.batch_of(spec)
    tr = port.Trainer(spec.build(), x, optimizer=port.optim.SGD(0.05, momentum=0.9), threads=1)
    port.compile(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), spec.classes)
    a = _losses([str(b) for b in binaries[:1]], tmp_path / "m.portrt", tmp_path / "d.portdata", 2)
    b = _losses(["qemu-aarch64", str(binaries[1])], tmp_path / "m.portrt", tmp_path / "d.portdata", 2)
    assert len(a) == 2 and a == b, list(zip(a, b))


def _family_nets():
    """(id, model, x, y): tests/e2e/test_rt.py's and tests/nets54.py's nets of issue 54's kernel families, each
    trained there by the host's port-rt bit for bit like the Trainer."""
    import test_rt as R
    from nets54 import NormPool, PaddedAttn, Views, WhereNet
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 11, (16, 7), generator=g)
    ids[::2, -2:] = 0                                        # padded rows
    return [("gates", R._Gates, torch.randn(16, 3, 6, 6)),                 # sigmoid, hardsigmoid, silu, bcast mul
            ("norms_pools_resize", NormPool, torch.randn(16, 3, 9, 11)),   # group/rms norm, pools, resizes
            ("shapes_unary", R._Shapes, torch.randn(16, 3, 6, 6)),         # cat, narrow, expand, unary math
            ("views", Views, torch.randn(16, 12)),                         # arena views beside slice copies
            ("grouped_conv", R._Grouped, torch.randn(16, 3, 8, 8)),        # grouped convs, stride 2
            ("masked_fill", R._CausalScores, torch.randn(16, 8, 6)),
            ("where", WhereNet, torch.randn(16, 5)),
            ("mask_chain", PaddedAttn, ids)]                               # mask cast/index/logic/compare, expand


@pytest.mark.parametrize("case", range(8), ids=["gates", "norms_pools_resize", "shapes_unary", "views",
                                                "grouped_conv", "masked_fill", "where", "mask_chain"])
def test_aarch64_build_trains_the_kernel_families_like_the_host(binaries, tmp_path, case):
    """Issue 54's kernel families beyond the three published models (activations and broadcast gates, norms,
    pools and resizes, shape copies and unary math, arena views, grouped convolutions, masked_fill, where, the
    mask kernels): each net's bundle trains under qemu-aarch64's portable build to the host build's losses bit
    for bit, every op on C."""
    host, arm = binaries
    name, net, x = _family_nets()[case]
    torch.manual_seed(0)
    y = torch.randint(0, 10, (16,))
    tr = port.Trainer(net(), x[:4], optimizer=port.optim.SGD(0.05, momentum=0.9), threads=1)
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops), name
    port.compile(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    a = _losses([str(host)], tmp_path / "m.portrt", tmp_path / "d.portdata", 3)
    b = _losses(["qemu-aarch64", str(arm)], tmp_path / "m.portrt", tmp_path / "d.portdata", 3)
    assert len(a) == 3 and a == b, (name, list(zip(a, b)))
