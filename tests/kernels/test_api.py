"""Binding <-> header consistency, error mapping, raw C status codes, workspace checks."""
import ctypes
import os
import re

import pytest
import torch

from conftest import ROOT
from port.exec import capi

HEADER = os.path.join(ROOT, "kernels", "include", "port_kernels.h")
RT_HEADER = os.path.join(ROOT, "kernels", "include", "port_rt.h")


def _header_text():
    return open(HEADER).read() + "\n" + open(RT_HEADER).read()


def test_every_header_function_binds(K):
    """Every PORT_API prototype of the two headers is bound, with the ctypes types of its C types, and nothing
    else; the parser misses none (an independent count of the prototypes' names)."""
    src = _header_text()
    sigs = capi.signatures()
    names = [n for n, _, _ in sigs]
    assert len(set(names)) == len(names)
    body = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    declared = set(re.findall(r"^PORT_API [^;]*?\b(port_\w+)\(", body, flags=re.M))
    assert declared == set(names) and len(names) >= 170
    for name, ret, args in sigs:
        fn = getattr(capi.raw, name)
        assert getattr(capi.raw, name[len("port_"):]) is fn
        assert fn.restype == capi.ctype_of(ret), name
        assert fn.argtypes == [capi.ctype_of(a) for a in args], name


def test_known_prototypes_bind_as_written():
    """A few prototypes spelled out here (independent of the parser): C types as the header writes them."""
    sigs = {n: (r, a) for n, r, a in capi.signatures()}
    assert sigs["port_status_string"] == ("const char*", ("int",))
    assert sigs["port_abi_version"] == ("int", ())
    assert sigs["port_conv2d_forward"] == ("port_status", ("float*", "const float*", "const float*", "const float*",
                                                           "const port_conv2d_params*", "int", "void*", "size_t"))
    assert sigs["port_rt_exec"] == ("port_status", ("const port_rt_call*", "void*const*", "void*",
                                                    "const port_rt_state*"))
    assert sigs["port_sgd_step"][1][4:] == ("double",) * 4 + ("int", "int")
    assert sigs["port_philox4x32_10"] == ("void", ("uint32_t*", "const uint32_t*", "const uint32_t*"))
    C = ctypes
    assert [capi.ctype_of(t) for t in sigs["port_conv2d_forward"][1]] == \
        [C.c_void_p] * 4 + [C.POINTER(capi.Conv2dParams), C.c_int, C.c_void_p, C.c_size_t]
    assert capi.ctype_of("const char*") is C.c_char_p and capi.ctype_of("port_status") is C.c_int
    assert capi.ctype_of("uint64_t") is C.c_uint64 and capi.ctype_of("float") is C.c_float
    with pytest.raises(TypeError):
        capi.ctype_of("long double")


def test_a_prototype_change_is_seen(K):
    """Editing a prototype in the header changes the binding: no second copy of the signatures to update."""
    src = _header_text()
    old = "PORT_API port_status port_relu_forward(float *y, const float *x, int64_t count);"
    assert old in src
    new = src.replace(old, "PORT_API port_status port_relu_forward(float *y, const float *x, int n, float a);\n"
                           "/* added */ PORT_API int port_abi_version_again(void);")
    before = {n: (r, a) for n, r, a in capi.parse_prototypes(src)}
    after = {n: (r, a) for n, r, a in capi.parse_prototypes(new)}
    assert before["port_relu_forward"][1] == ("float*", "const float*", "int64_t")
    assert after["port_relu_forward"][1] == ("float*", "const float*", "int", "float")
    assert after["port_abi_version_again"] == ("int", ())
    assert set(after) - set(before) == {"port_abi_version_again"}
    ns = type("NS", (), {})()
    lib = capi.load()
    capi.bind(lib, [(n, r, a) for n, (r, a) in after.items() if n == "port_relu_forward"], ns)
    assert ns.port_relu_forward.argtypes == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_float]
    capi.bind(lib, [(n, r, a) for n, (r, a) in before.items() if n == "port_relu_forward"], ns)  # restore
    assert capi.raw.relu_forward.argtypes == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    with pytest.raises(AttributeError):   # a prototype the built library lacks: a stale build is refused
        capi.bind(lib, [("port_abi_version_again", "int", ())], ns)


def test_unparseable_prototypes_are_refused():
    ok = "PORT_API int port_a(int x);\n#define PORT_API visible\n// PORT_API int port_b(int);\n"
    assert capi.parse_prototypes(ok) == [("port_a", "int", ("int",))]
    for bad in ("PORT_API int port_a(int (*cb)(int));",            # a function pointer argument
                "PORT_API int port_a(int);",                        # an argument without a name
                "PORT_API port_a(int x);",                          # no return type
                "PORT_API int port_a(int x);\nPORT_API int port_a(int x);"):
        with pytest.raises(capi.HeaderError):
            capi.parse_prototypes(bad)


def test_param_structs_match_header(K):
    src = open(HEADER).read()
    for cname, cls in (("port_conv2d_params", capi.Conv2dParams),
                       ("port_batchnorm_params", capi.BatchNormParams),
                       ("port_pool2d_params", capi.Pool2dParams),
                       ("port_linear_params", capi.LinearParams)):
        body = re.search(r"typedef struct \{([^}]*)\}\s*" + cname + ";", src).group(1)
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        fields = []
        for decl in body.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            typ, names = decl.split(None, 1)
            fields += [(n.strip(), typ) for n in names.split(",")]
        names = {ctypes.c_int64: "int64_t", ctypes.c_float: "float"}
        ours = [(f, names[t]) for f, t in cls._fields_]
        assert ours == fields, cname


def test_status_strings(K):
    assert capi.status_string(0) == "ok"
    assert "workspace" in capi.status_string(capi.PORT_ERR_WORKSPACE)
    assert capi.raw.port_abi_version() == 2


def test_raw_conv_status_codes(K):
    P = capi.Conv2dParams
    x, w, y = torch.randn(1, 4, 5, 5), torch.randn(6, 2, 3, 3), torch.empty(1, 6, 5, 5)
    ws = torch.empty(10_000, dtype=torch.uint8)
    good = P(1, 4, 5, 5, 6, 3, 3, 1, 1, 1, 1, 2)
    f = capi.raw.port_conv2d_forward
    args = lambda p, wsb=ws.numel(): (y.data_ptr(), x.data_ptr(), w.data_ptr(), None, p,  # noqa
                                      capi.CONV_IM2COL, ws.data_ptr(), wsb)
    assert f(*args(good)) == capi.PORT_OK
    assert f(*args(P(1, 4, 5, 5, 6, 3, 3, 1, 1, 1, 1, 3))) == capi.PORT_ERR_SHAPE  # groups
    assert f(*args(P(1, 4, 5, 5, 6, 3, 3, 0, 1, 1, 1, 2))) == capi.PORT_ERR_ARG  # stride 0
    assert f(*args(P(0, 4, 5, 5, 6, 3, 3, 1, 1, 1, 1, 2))) == capi.PORT_ERR_SHAPE  # n = 0
    assert f(*args(P(1, 4, 1, 1, 6, 3, 3, 1, 1, 0, 0, 2))) == capi.PORT_ERR_SHAPE  # kernel > input
    need = capi.raw.port_conv2d_workspace_bytes(good, capi.CONV_IM2COL)
    # a group's im2col (2 channels x 9 taps x 25 pixels) per workspace slot, one slot per group up to 16: the
    # grouped path runs its small per-group GEMMs one group per slot, in parallel
    assert need == min(2, 16) * 2 * 9 * 25 * 4
    assert f(*args(good, need)) == capi.PORT_OK
    assert f(*args(good, need - 1)) == capi.PORT_ERR_WORKSPACE
    assert f(y.data_ptr(), x.data_ptr(), w.data_ptr(), None, good, capi.CONV_IM2COL, None,
             need) == capi.PORT_ERR_WORKSPACE
    assert f(None, x.data_ptr(), w.data_ptr(), None, good, capi.CONV_IM2COL, ws.data_ptr(),
             need) == capi.PORT_ERR_NULL
    assert f(*args(good)[:5], capi.CONV_DIRECT, ws.data_ptr(), need) == capi.PORT_ERR_UNSUPPORTED
    assert f(*args(good)[:5], 7, ws.data_ptr(), need) == capi.PORT_ERR_ARG
    # output aliasing its input is refused by C as well
    xa = torch.randn(1, 4, 5, 5)
    assert f(xa.data_ptr(), xa.data_ptr(), w.data_ptr(), None, P(1, 4, 5, 5, 4, 3, 3, 1, 1, 1, 1, 2),
             capi.CONV_IM2COL, ws.data_ptr(), ws.numel()) == capi.PORT_ERR_ALIAS
    # patch workspace
    pw = capi.raw.port_conv2d_patch_workspace_bytes(good, 2, 2)
    assert pw == (18 + 3) * 4 * 4  # tile narrower than W_out: + output-tile buffer
    assert capi.raw.port_conv2d_patch_workspace_bytes(good, 2, 5) == 18 * 10 * 4  # full width
    assert capi.raw.port_conv2d_patch_forward(y.data_ptr(), x.data_ptr(), w.data_ptr(), None, good, 2,
                                           2, ws.data_ptr(), pw - 4) == capi.PORT_ERR_WORKSPACE
    assert capi.raw.port_conv2d_patch_forward(y.data_ptr(), x.data_ptr(), w.data_ptr(), None, good, 0,
                                           2, ws.data_ptr(), pw) == capi.PORT_ERR_ARG


def test_raw_other_status_codes(K):
    t = torch.randn(10)
    assert capi.raw.port_relu_forward(t.data_ptr(), None, 10) == capi.PORT_ERR_NULL
    assert capi.raw.port_relu_forward(t.data_ptr(), t.data_ptr(), -1) == capi.PORT_ERR_SHAPE
    m = torch.empty(10, dtype=torch.uint8)
    assert capi.raw.port_dropout_forward(t.data_ptr(), m.data_ptr(), t.data_ptr(), 10, 1.0,
                                      0, 0) == capi.PORT_ERR_ARG
    bn = capi.BatchNormParams(1, 10, 1, 1, 1e-5, 0.1)
    sm, si = torch.empty(10), torch.empty(10)
    assert capi.raw.port_batchnorm2d_forward_train(t.data_ptr(), sm.data_ptr(), si.data_ptr(), None,
                                                None, t.data_ptr(), None, None,
                                                bn) == capi.PORT_ERR_SHAPE  # 1 value per channel
    bn = capi.BatchNormParams(2, 5, 1, 1, -1.0, 0.1)
    assert capi.raw.port_batchnorm2d_forward_train(t.data_ptr(), sm.data_ptr(), si.data_ptr(), None,
                                                None, t.data_ptr(), None, None,
                                                bn) == capi.PORT_ERR_ARG  # eps < 0
    lab = torch.tensor([0, 5], dtype=torch.int64)
    loss, pr = torch.empty(1), torch.empty(2, 5)
    assert capi.raw.port_softmax_xent_forward(loss.data_ptr(), pr.data_ptr(), t.data_ptr(),
                                           lab.data_ptr(), 2, 5, 0.0) == capi.PORT_ERR_ARG
    pp = capi.Pool2dParams(1, 1, 4, 4, 2, 2, 2, 2, 2, 2)  # pad > kernel/2
    assert capi.raw.port_maxpool2d_forward(t.data_ptr(), t.data_ptr(), t.data_ptr(),
                                        pp) == capi.PORT_ERR_ARG
    assert capi.raw.port_sgd_step(t.data_ptr(), None, t.data_ptr(), 10, 0.1, 0.9, 0.0, 0.0, 0,
                               1) == capi.PORT_ERR_NULL
    assert capi.raw.port_adamw_step(t.data_ptr(), t.data_ptr(), t.data_ptr(), t.data_ptr(), 10, 0.1,
                                 0.9, 0.999, 1e-8, 0.0, 0) == capi.PORT_ERR_ARG
    assert capi.raw.port_set_gemm_backend(5) == capi.PORT_ERR_ARG
    assert capi.raw.port_sgemm(t.data_ptr(), t.data_ptr(), t.data_ptr(), 0, 0, 2, 2, 2, 1.0, 0.0, 1,
                            2, 2) == capi.PORT_ERR_SHAPE  # lda < k


def test_wrapper_errors(K):
    x, w = torch.randn(2, 4, 5, 5), torch.randn(6, 4, 3, 3)
    with pytest.raises(ValueError, match=r"^x: expected dtype torch.float32"):
        K.conv2d_forward(x.double(), w)
    with pytest.raises(ValueError, match=r"^x: must be contiguous"):
        K.conv2d_forward(x.transpose(2, 3), w)
    with pytest.raises(ValueError, match=r"^x: expected a 4-D tensor"):
        K.conv2d_forward(x[0], w)
    with pytest.raises(ValueError, match=r"^w: expected shape\[1\] == c_in/groups"):
        K.conv2d_forward(x, torch.randn(6, 3, 3, 3))
    with pytest.raises(ValueError, match=r"^groups"):
        K.conv2d_forward(x, torch.randn(6, 4, 3, 3), groups=3)
    with pytest.raises(ValueError, match=r"^b: expected shape \(6,\)"):
        K.conv2d_forward(x, w, torch.randn(5))
    with pytest.raises(ValueError, match=r"^dy: expected shape"):
        K.conv2d_backward_input(torch.randn(2, 6, 4, 4), w, x.shape, padding=1)
    with pytest.raises(ValueError, match=r"^algo"):
        K.conv2d_forward(x, w, algo="fft")
    with pytest.raises(ValueError, match=r"^labels: expected dtype torch.int64"):
        K.softmax_xent_forward(torch.randn(3, 4), torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^mask: expected dtype torch.uint8"):
        K.dropout_backward(torch.randn(4), torch.ones(4), 0.5)
    with pytest.raises(ValueError, match=r"^x: expected a torch.Tensor"):
        K.relu_forward([1.0, 2.0])
    # aliasing: outputs overlapping inputs are refused unless it is a documented in-place variant
    big = torch.randn(2 * 6 * 5 * 5 + 100)
    xa = big[: x.numel()].view(x.shape)
    with pytest.raises(ValueError, match=r"^out: output aliases x"):
        K.conv2d_forward(xa, w, padding=1, out=big[10: 10 + 2 * 6 * 25].view(2, 6, 5, 5))
    t = torch.randn(11)
    with pytest.raises(ValueError, match=r"^out: output aliases x"):
        K.relu_forward(t[0:10], out=t[1:11])  # overlapping but not identical
    K.relu_forward(t[0:10], out=t[0:10])  # identical: the documented in-place variant
    with pytest.raises(ValueError, match=r"^out: output aliases b"):
        K.add(torch.randn(10), t[0:10], out=t[1:11])
    xb = torch.randn(2, 4, 6, 6)
    with pytest.raises(ValueError, match=r"^dw: output aliases x"):
        K.conv2d_backward_weight(torch.randn(2, 6, 4, 4), xb, w.shape,
                                 dw=xb.view(-1)[: w.numel()].view(w.shape))
    with pytest.raises(ValueError, match=r"^out: output aliases x"):
        K.hardswish_forward(t, out=t)  # hardswish backward needs x: no in-place forward
    # C-side failure surfaces as an exception with the C message
    with pytest.raises(capi.WorkspaceError, match="workspace too small"):
        K.conv2d_forward(x, w, padding=1, workspace=torch.empty(16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="invalid scalar"):
        capi.check(capi.PORT_ERR_ARG, "somewhere")


def test_workspace_query_respected(K):
    """The kernels never touch workspace bytes beyond the query (guard pattern survives)."""
    x, w, b = torch.randn(2, 4, 9, 7), torch.randn(6, 2, 3, 3), torch.randn(6)
    p = K.conv2d_params(x.shape, w.shape, 2, 1, 2)
    need = K.conv2d_workspace_bytes(p, "im2col")
    ws = torch.full((need + 64,), 0xAB, dtype=torch.uint8)
    y = K.conv2d_forward(x, w, b, 2, 1, 2, algo="im2col", workspace=ws[:need])
    K.conv2d_backward_input(torch.randn(y.shape), w, x.shape, 2, 1, 2, algo="im2col",
                            workspace=ws[:need])
    K.conv2d_backward_weight(torch.randn(y.shape), x, w.shape, 2, 1, 2, algo="im2col",
                             workspace=ws[:need])
    assert bool((ws[need:] == 0xAB).all())


def test_set_num_threads(K):
    capi.set_num_threads(1)
    assert capi.get_num_threads() == 1 and torch.get_num_threads() == 1
    capi.set_num_threads(2)
    assert capi.get_num_threads() == 2 and torch.get_num_threads() == 2
    with pytest.raises(ValueError):
        capi.set_num_threads(0)


def test_gemm_backend_switch(K):
    prev = capi.get_gemm_backend()
    with capi.gemm_backend("vendored"):
        assert capi.get_gemm_backend() == "vendored"
    assert capi.get_gemm_backend() == prev
    with capi.gemm_backend("blas"):
        assert capi.get_gemm_backend() == "blas"
    with capi.gemm_backend("auto"):
        assert capi.get_gemm_backend() == "auto"
    assert capi.get_gemm_backend() == prev
    with pytest.raises(ValueError, match="backend"):
        capi.set_gemm_backend("mkl")


@pytest.mark.parametrize("coretype", ["Haswell", "SkylakeX"])
def test_default_gemm_backend_follows_the_cpu(coretype):
    """On a CPU with AVX-512 the default GEMM is 'auto' (the vendored one, OpenBLAS for small or narrow products)
    where OpenBLAS runs AVX-512 kernels (OPENBLAS_CORETYPE here), the vendored one where it does not; OpenBLAS on
    other CPUs."""
    import subprocess
    import sys
    if not capi.raw.port_cpu_has_avx512() and coretype == "SkylakeX":
        pytest.skip("OpenBLAS cannot run SkylakeX kernels on a CPU without AVX-512")
    code = "from port.exec import capi; print(capi.get_gemm_backend(), capi.raw.port_cpu_has_avx512())"
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_CORETYPE=coretype)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    backend, avx512 = out.stdout.split()
    want = ("auto" if coretype == "SkylakeX" else "vendored") if avx512 == "1" else "blas"
    assert backend == want, out.stdout


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1)])
def test_auto_gemm_runs_blas_on_small_or_narrow_products_and_vendored_on_large(K, ta, tb):
    """'auto' picks by shape (port__gemm_pick): the vendored GEMM's narrow kernels where they take the product
    (AVX-512, m >= 16: NN/TN with m*k >= 65536 and n <= 32, or NN n in (32, 64] by 16s; NT k <= 16, n >= 64
    and m*n >= 65536),
    else OpenBLAS for n <= 16 and for <= 2^20 multiply-adds, the vendored GEMM otherwise; its results equal the
    picked backend's bit for bit."""
    avx512 = bool(capi.raw.port_cpu_has_avx512())

    def narrow(m, n, k):
        if not avx512 or m < 16:
            return False
        if not tb:
            return k >= 16 and m * k >= 65536 and (n <= 32 or (not ta and n <= 64 and n % 16 == 0))
        return not ta and k <= 16 and n >= 64 and m * n >= 65536
    def run(backend, m, n, k):
        g = torch.Generator().manual_seed(m * n + k)
        a = torch.randn((k, m) if ta else (m, k), generator=g)
        b = torch.randn((n, k) if tb else (k, n), generator=g)
        with capi.gemm_backend(backend):
            return K.sgemm(a, b, trans_a=bool(ta), trans_b=bool(tb))
    told_apart = 0
    for m, n, k in [(64, 128, 27), (4608, 16, 512), (300, 8, 70), (64, 1024, 576), (200, 300, 100),
                    (1000, 48, 100), (30, 20, 10), (512, 1152, 8), (300, 8, 700)]:
        small = (n <= 16 or m * n * k <= 2 ** 20) and not narrow(m, n, k)
        with capi.gemm_backend("auto"):
            assert capi.gemm_backend_for(ta, tb, m, n, k) == ("blas" if small else "vendored")
        for fixed in ("blas", "vendored"):
            with capi.gemm_backend(fixed):
                assert capi.gemm_backend_for(ta, tb, m, n, k) == fixed
        auto = run("auto", m, n, k)
        want = run("blas" if small else "vendored", m, n, k)
        assert torch.equal(auto, want), (m, n, k)
        told_apart += not torch.equal(want, run("vendored" if small else "blas", m, n, k))
    assert told_apart >= 1   # the backends round differently on some shapes, so a wrong pick would show


@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("m,n,k", [(301, 530, 270), (13, 1100, 513), (290, 40, 600), (37, 16, 300), (40, 5, 257)])
def test_vendored_sgemm_blocks_and_threads(K, ta, tb, m, n, k):
    """The vendored GEMM across its block edges (AVX-512: 288-row tasks, 144-row A blocks, 512-column B blocks,
    256-deep K blocks, half-width tiles of <= 16 columns; portable: 256 / 64 / 64 / 256) matches float64 and gives
    the same bits at 1, 2 and 3 threads, whose task grids differ."""
    a = torch.randn((k, m) if ta else (m, k))
    b = torch.randn((n, k) if tb else (k, n))
    ref = (a.T if ta else a).double() @ (b.T if tb else b).double()
    prev = capi.get_num_threads()
    outs = []
    try:
        with capi.gemm_backend("vendored"):
            for t in (1, 2, 3):
                capi.set_num_threads(t)
                outs.append(K.sgemm(a, b, trans_a=bool(ta), trans_b=bool(tb), alpha=0.5))
    finally:
        capi.set_num_threads(prev)
    assert torch.allclose(outs[0].double(), 0.5 * ref, atol=1e-3, rtol=1e-4)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_one_openmp_pool_shared_with_torch(K):
    """PORT's kernels and torch use the same OpenMP runtime: torch.set_num_threads acts on PORT too."""
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert capi.get_num_threads() == 1
        torch.set_num_threads(2)
        assert capi.get_num_threads() == 2
    finally:
        capi.set_num_threads(prev)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux only")
@pytest.mark.parametrize("torch_first", [True, False])
def test_single_openmp_runtime_in_process(torch_first):
    """Whatever the import order, exactly one OpenMP runtime is mapped and PORT resolves its symbols there."""
    import subprocess
    import sys
    load = "from port.exec import capi; capi.load()"
    imports = f"import torch; {load}" if torch_first else f"{load}; import torch"
    code = (f"{imports}\n"
            "import checked as K\n"
            "import re, torch.nn.functional as F\n"
            "capi.set_num_threads(2); x = torch.randn(2, 8, 16, 16); w = torch.randn(8, 8, 3, 3)\n"
            "K.conv2d_forward(x, w, padding=1); F.conv2d(x, w, padding=1)\n"
            "maps = {l.split()[-1] for l in open('/proc/self/maps') if re.search(r'/lib(gomp|iomp5|omp)[-.]', l)}\n"
            "print(len(maps), capi.openmp_runtime() is not None or bool(capi.loaded_path()))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "kernels")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True"], out.stdout


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux only")
def test_loading_the_kernels_starts_no_openblas_pool():
    """PORT calls OpenBLAS single-threaded: loading the kernels (which imports scipy_openblas32, whose import
    loads OpenBLAS) adds no thread to the process and leaves OPENBLAS_NUM_THREADS as it was.  torch and numpy
    (with numpy's own OpenBLAS pool) are imported first, so only the kernels' threads are counted."""
    import subprocess
    import sys
    code = ("import os, torch, numpy\n"
            "n0 = len(os.listdir('/proc/self/task'))\n"
            "from port.exec import capi\n"
            "capi.load()\n"
            "print(len(os.listdir('/proc/self/task')) - n0, os.environ.get('OPENBLAS_NUM_THREADS', '-'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                                                          "OMP_NUM_THREADS")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="2")   # OpenBLAS sizes a pool from OMP_NUM_THREADS too
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "-"], out.stdout


@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("m,n,k", [(200, 77, 96), (37, 301, 128), (64, 64, 300)])
def test_sgemm_split_over_threads(K, ta, tb, m, n, k):
    """GEMMs above the split threshold (row or column blocks per OpenMP thread) equal the 1-thread result."""
    a = torch.randn((k, m) if ta else (m, k))
    b = torch.randn((n, k) if tb else (k, n))
    ref = (a.T if ta else a).double() @ (b.T if tb else b).double()
    prev = capi.get_num_threads()
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            c = K.sgemm(a, b, trans_a=bool(ta), trans_b=bool(tb))
            assert torch.allclose(c.double(), ref, atol=1e-3, rtol=1e-4), t
    finally:
        capi.set_num_threads(prev)


def test_build_id_names_the_gemm(K):
    """Profiles record build_id(): the kernel library's digest and the GEMM backend, whose default depends on the
    CPU and OpenBLAS's core, so times measured with one GEMM are not reused under the other."""
    with capi.gemm_backend("vendored"):
        vendored = capi.build_id()
    with capi.gemm_backend("auto"):
        auto = capi.build_id()
    blas = capi.build_id()          # the fixture's backend
    assert vendored.endswith("-vendored") and blas.endswith("-blas") and auto.endswith("-auto"), (vendored, blas)
    assert vendored[:16] == blas[:16] == auto[:16] and len(vendored.split("-")[0]) == 16
