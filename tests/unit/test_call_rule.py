"""The C call rule (issue 53: port-rt never touches memory outside its arena).

One definition, kernels/runtime/rt_check.c (port_rt_call_check), applied by the bundle loader to every call of a
bundle and by port.lower.arena.check_program to every encoded C call of a program. Held here to the Python
executor's truth: for every C call of the compiled programs of several nets (zoo models, sequence models, a net
with every element-wise and pooling kernel, and plans that take every legal variant: patch bands, im2col,
winograd, fused, in place), the bytes the C rule computes from a call's integer parameters are exactly the bytes
of the operands' slots (the op records' call shapes) and its workspace is the call's. Then mutations of one call
(a shape parameter enlarged, a pointer at arena_bytes - 1, a workspace too small, a NaN, an enum out of range, an
output over an input) are refused by the C loader (port-rt exits 2 naming the call and its kernel), by
check_bundle and by check_program (ProgramError)."""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import math
import os
import struct
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import port
import port.models as M
from port.errors import ProgramError
from port.exec import capi, rtcall
from port.exec.bundle import BundleError, build_bundle, check_bundle
from port.lower.arena import check_program
from port.lower.lower import default_plan, lower
from port.plan import variants as V
from port.plan.types import OpDecision

from nets54 import AvgPools, LastTokenPool, NormPool, PadEmb, PaddedAttn, WhereNet  # (tests/nets54.py: issue 54's nets)

ROOT = Path(__file__).resolve().parents[2]
CALL_BYTES = ctypes.sizeof(capi.RtCall)


class Zoo(nn.Module):
    """A small net with every C element-wise and pooling kernel: max and average pooling, hardswish, relu6,
    tanh, gelu, dropout, layer norm, global average pooling, an add, a linear; a frozen batch norm (eval mode),
    a conv whose weight is frozen (its bias alone trains), a batched matmul, a scaling and a softmax."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.b2 = nn.BatchNorm2d(8).eval()
        self.c3 = nn.Conv2d(8, 16, 1)
        self.c3.weight.requires_grad_(False)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 10)
        self.drop = nn.Dropout(0.25)

    def train(self, mode=True):
        super().train(mode)
        self.b2.eval()
        return self

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = nn.functional.max_pool2d(x, 2)
        y = nn.functional.hardswish(self.b2(self.c2(x)))
        x = nn.functional.relu6(x + y)
        x = nn.functional.avg_pool2d(self.c3(x), 2)
        x = torch.tanh(x).mean((2, 3))
        x = self.drop(nn.functional.gelu(self.ln(x)))
        t = x.view(-1, 4, 4)
        x = x + torch.softmax(torch.matmul(t, t) * 0.5, -1).reshape(-1, 16)
        return self.fc(x)


class RngAttn(nn.Module):
    """Issue 54's random ops and attention forms: causal grouped-query attention with attention dropout, attention
    under a full additive mask and under a per-key boolean one, stochastic depth (bernoulli) and dropout."""

    def __init__(self):
        super().__init__()
        self.q, self.kv, self.fc = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 10)
        g = torch.Generator().manual_seed(2)
        self.register_buffer("add", torch.randn(2, 4, 5, 5, generator=g))
        self.register_buffer("keys", torch.tensor([True, False, True, True, True]))

    def forward(self, x):
        F = nn.functional
        n, t, _ = x.shape
        q, kv = self.q(x).view(n, t, 4, 2).transpose(1, 2), self.kv(x).view(n, t, 2, 2).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, kv, kv, dropout_p=0.3, is_causal=True, enable_gqa=True)
        a = F.scaled_dot_product_attention(a, q, q, attn_mask=self.add)
        a = F.scaled_dot_product_attention(a, a, q, attn_mask=self.keys)
        keep = x.new_empty((n, 1, 1)).bernoulli_(0.6).div_(0.6)
        return self.fc(F.dropout(a.transpose(1, 2).reshape(n, t, 8) * keep, 0.1).mean(1))


def _seq(name):
    from port.transformers import bert_tiny, gpt_tiny
    g = torch.Generator().manual_seed(3)
    if name == "gpt_tiny":
        return gpt_tiny(layers=1, dim=32, heads=2, context=16, vocab=48), torch.randint(0, 48, (2, 16), generator=g)
    return bert_tiny(layers=1, dim=32, heads=2, context=16, vocab=48), torch.randint(1, 48, (2, 16), generator=g)


class Shapes(nn.Module):
    """Issue 54's shape copies and unary math: split, cat, slices, an expanded parameter, exp / neg / pow / rsqrt."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 5, 3, padding=1)
        self.tok = nn.Parameter(torch.randn(1, 3))
        self.fc = nn.Linear(6 * 16 + 3, 4)

    def forward(self, x):
        h = self.c1(x)
        a, b = h.split([2, 3], 1)
        h = torch.cat([b * torch.rsqrt(b.pow(2) + 1.0), a.exp(), -a[:, :1].cos()], 1)[:, :, 2:6, 2:6]
        return self.fc(torch.cat([h.flatten(1), self.tok.expand(x.shape[0], -1)], 1))


CASES = {
    "digits_cnn": lambda: (M.get("digits_cnn", seed=0), torch.randn(4, 1, 8, 8), "sgd"),
    "resnet8": lambda: (M.get("resnet8", seed=0), torch.randn(2, 3, 16, 16), "sgd"),
    "mlp": lambda: (M.get("mlp", seed=0, hidden=(32, 16)), torch.randn(4, 64), "adamw"),
    "zoo": lambda: (Zoo(), torch.randn(2, 3, 16, 16), "sgd"),
    "gpt_tiny": lambda: (*_seq("gpt_tiny"), "sgd"),
    "bert_tiny": lambda: (*_seq("bert_tiny"), "adamw"),
    "normpool": lambda: (NormPool(), torch.randn(2, 3, 9, 11), "sgd"),
    "avg_pools": lambda: (AvgPools(), torch.randn(2, 3, 9, 7), "sgd"),
    "rng_attn": lambda: (RngAttn(), torch.randn(2, 5, 8), "sgd"),
    "shapes": lambda: (Shapes(), torch.randn(2, 3, 8, 8), "sgd"),
    "pad_emb": lambda: (PadEmb(), torch.tensor([[0, 3, 4, 0], [5, 0, 9, 10]]), "sgd"),
    "padded_attn": lambda: (PaddedAttn(), torch.tensor([[3, 1, 4, 1, 5, 0, 0], [2, 7, 1, 8, 2, 8, 1]]), "sgd"),
    "where_net": lambda: (WhereNet(), torch.randn(3, 5), "sgd"),
    "last_token": lambda: (LastTokenPool(), torch.tensor([[3, 1, 4, 1, 5, 0, 0], [2, 7, 1, 8, 2, 8, 1]]), "sgd"),
}


def _trainer(name):
    torch.manual_seed(0)
    m, x, opt = CASES[name]()
    o = port.optim.AdamW(1e-3) if opt == "adamw" else port.optim.SGD(0.05, momentum=0.9)
    return port.Trainer(m, x, optimizer=o)


PREFER = (("fused", "patch8"), ("patch4", "tiled"), ("im2col", "winograd", "plain"))


def _variant_plan(tr, prefer):
    """The trainer's plan with each op on the first of ``prefer`` among its legal C variants (else plain): fused
    conv+bn+relu chains, patch bands, im2col, winograd, tiled attention, where each applies (the default plan
    runs in place wherever legal)."""
    g, plan = tr.graph, tr.plan
    ops = []
    for d in plan.ops:
        vs = V.variants(g, g.op(d.op), "c")
        ops.append(OpDecision(d.op, d.accelerator, next((v for v in prefer if v in vs), "plain")))
    return dataclasses.replace(plan, ops=tuple(ops))


def _programs(name):
    """The trainer's training and inference programs; for the conv nets also the PREFER plans' and the unfused
    default plan's (in-place batch norm) without overwriting weight gradients (the accumulating kernel)."""
    tr = _trainer(name)
    progs = [tr.program, tr.eval_program]
    if name in ("resnet8", "zoo"):
        progs += [lower(tr.graph, _variant_plan(tr, prefer)) for prefer in PREFER]
        progs.append(lower(tr.graph, default_plan(tr.graph, fuse=False), overwrite_gradients=False))
    elif name in ("gpt_tiny", "rng_attn"):
        progs.append(lower(tr.graph, _variant_plan(tr, ("plain",))))
    return progs


def _extents_match_slots(prog, seen):
    """Every C call: check_program's C rule passes, and the rule's operand bytes cover exactly each operand's
    slot (the union over the call's pointers into it is [0, slot bytes)); its workspace is the call's."""
    for c in prog.calls:
        if c.backend != "c":
            continue
        enc = rtcall.encode(c, lambda t: prog.slot(t).shape)
        r = rtcall.record(c, prog.slot)
        shape = rtcall.call_shape(r)
        rtcall.check_record(r, c, prog.arena_bytes, prog.persistent_bytes)
        seen.add(r.kernel)
        assert shape.nptrs >= len(enc.ptrs), (c.name, enc.entry)
        # (a conv's weight gradient with only its bias trainable runs port_bias_backward, no workspace, but the
        # registry's query still gives the conv's: more than the kernel needs, which the rule allows)
        assert shape.ws_bytes == c.workspace_bytes or (enc.entry == "port_bias_backward" and shape.ws_bytes == 0), \
            (c.name, enc.entry, shape.ws_bytes, c.workspace_bytes)
        cover: dict[int, list[tuple[int, int]]] = {}
        for i, p in enumerate(enc.ptrs):
            if p is None:
                continue
            cover.setdefault(p[0], []).append((p[1], p[1] + shape.bytes[i]))
        for tid, spans in cover.items():
            spans.sort()
            end = 0
            for a, b in spans:
                assert a <= end, (c.name, enc.entry, tid, spans)
                end = max(end, b)
            assert spans[0][0] == 0 and end == prog.slot(tid).nbytes, \
                (c.name, enc.entry, prog.slot(tid).name, spans, prog.slot(tid).nbytes)


# the kernels each case must reach (together: every port-rt kernel id but the batch norm's in-place backward
# from the output and the page calls)
REACH = {
    "digits_cnn": {"port_conv2d_bn_relu_forward_train", "port_maxpool2d_forward", "port_softmax_xent_forward"},
    "resnet8": {"port_conv2d_patch_forward", "port_conv2d_patch_backward_input", "port_conv2d_patch_backward_weight",
                "port_conv2d_backward_weight", "port_conv2d_backward_weight_overwrite",
                "port_conv2d_bn_relu_forward_train", "port_batchnorm2d_forward_eval", "port_sgd_step"},
    "mlp": {"port_linear_forward", "port_linear_backward_input", "port_linear_backward_weight", "port_adamw_step"},
    "zoo": {"port_avgpool2d_forward", "port_avgpool2d_backward_input", "port_maxpool2d_forward",
            "port_maxpool2d_backward_input", "port_hardswish_forward", "port_hardswish_backward",
            "port_relu6_forward", "port_relu6_backward", "port_tanh_forward", "port_tanh_backward",
            "port_gelu_forward", "port_gelu_backward", "port_dropout_forward", "port_dropout_backward",
            "port_layernorm_forward", "port_layernorm_backward_input", "port_layernorm_backward_weight",
            "port_batchnorm2d_backward_input_eval", "port_batchnorm2d_backward_weight_eval", "port_bias_backward",
            "port_bmm", "port_scale", "port_softmax_forward", "port_softmax_backward", "port_global_avgpool_forward",
            "port_global_avgpool_backward_input", "port_add"},
    "gpt_tiny": {"port_embedding_forward", "port_embedding_backward_weight", "port_attention_forward",
                 "port_attention_backward", "port_softmax_xent_ignore_forward", "port_softmax_xent_ignore_backward",
                 "port_add_broadcast", "port_sum_rows", "port_permute"},
    "bert_tiny": {"port_ne_scalar_i64", "port_mean_mid_forward", "port_mean_mid_backward", "port_adamw_step"},
    "normpool": {f"port_{k}" for k in ("rmsnorm_forward", "rmsnorm_backward_input", "rmsnorm_backward_weight",
                                       "groupnorm_forward", "groupnorm_backward_input", "groupnorm_backward_weight",
                                       "upsample2d_forward", "upsample2d_backward_input",
                                       "adaptive_avgpool2d_forward", "adaptive_avgpool2d_backward_input",
                                       "maxpool2d_forward", "maxpool2d_backward_input")},
    "avg_pools": {"port_avgpool2d_forward", "port_avgpool2d_backward_input"},   # ceil mode, count_include_pad
    "rng_attn": {"port_attention_forward", "port_attention_backward", "port_bernoulli_forward",
                 "port_dropout_forward", "port_dropout_backward"},
    "pad_emb": {"port_embedding_forward", "port_embedding_backward_weight_pad", "port_mean_mid_forward"},
    "padded_attn": {"port_mask_cast", "port_mask_index2", "port_mask_logic", "port_expand_mask",
                    "port_mask_compare", "port_mask_compare_scalar"},
    "where_net": {"port_where_forward", "port_where_backward"},
    "last_token": {"port_mask_cast", "port_int_binary", "port_argmax_rows", "port_index2_rows"},
    "shapes": {"port_unary_forward", "port_unary_backward", "port_slice_copy", "port_expand",
               "port_binary_backward"},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_c_rule_extents_equal_the_slots_of_every_call(name):
    seen: set[int] = set()
    for prog in _programs(name):
        _extents_match_slots(prog, seen)
    names = {capi.raw.port_rt_kernel_name(i).decode() for i in seen}
    assert REACH[name] <= names, sorted(REACH[name] - names)


# ---------------------------------------------------------------------------------------------- mutations
def _call_of(prog, entry):
    for c in prog.calls:
        if c.backend == "c" and rtcall.encode(c, lambda t: prog.slot(t).shape).entry == entry:
            return c
    raise AssertionError(f"no {entry} call")


def _mutants(A, name="zoo"):
    """(name, kernel entry, how to change its record) -- each must be refused."""
    def setf(field, i, v):
        def f(r):
            getattr(r, field)[i] = v
        return f

    def ws_small(r):
        r.ws_bytes -= 64

    def ws_top(r):
        r.ws_offset = A - 8

    def alias(r):           # hardswish's output over its input: the backward reads the input
        r.ptr[0] = r.ptr[1]
    if name == "rng_attn":
        fwd, bwd = "port_attention_forward", "port_attention_backward"
        return [
            ("bernoulli probability 1.5", "port_bernoulli_forward", setf("fv", 0, 1.5)),
            ("bernoulli count x 1000", "port_bernoulli_forward", lambda r: setf("iv", 0, r.iv[0] * 1000)(r)),
            ("bernoulli extra int", "port_bernoulli_forward", setf("iv", 1, 1)),
            ("attention dropout p = 1", fwd, setf("fv", 1, 1.0)),
            ("attention dropout p NaN", bwd, setf("fv", 1, math.nan)),
            ("attention kv heads 3 of 4", fwd, setf("iv", 7, 3)),
            ("attention kv heads above heads", bwd, setf("iv", 7, 8)),
            ("attention mask kind 3", fwd, setf("iv", 8, 3)),
            ("attention mask extent 3", fwd, setf("iv", 12, 3)),
            ("attention forward op id -1", bwd, setf("iv", 13, -1)),
            ("attention extra int", fwd, setf("iv", 14, 1)),
        ]
    return [
        ("relu count 2^28", "port_relu_forward", setf("iv", 0, 1 << 28)),
        ("relu count -1", "port_relu_forward", setf("iv", 0, -1)),
        ("relu output at arena_bytes - 1", "port_relu_forward", setf("ptr", 0, A - 1)),
        ("relu output at arena_bytes - 4", "port_relu_forward", setf("ptr", 0, A - 4)),
        ("misaligned input", "port_relu_forward", setf("ptr", 1, 2)),
        ("extra pointer", "port_relu_forward", setf("ptr", 5, 0)),
        ("extra int", "port_relu_forward", setf("iv", 3, 1)),
        ("conv c_out x 64", "port_conv2d_forward", lambda r: (setf("iv", 4, r.iv[4] * 64)(r), setf("iv", 12, 0)(r))),
        ("conv batch 2^40", "port_conv2d_forward", setf("iv", 0, 1 << 40)),
        ("conv algorithm 9", "port_conv2d_forward", setf("iv", 14, 9)),
        ("conv workspace too small", "port_conv2d_forward", ws_small),
        ("conv workspace past the arena", "port_conv2d_forward", ws_top),
        ("linear out_features x 1000", "port_linear_forward", lambda r: setf("iv", 2, r.iv[2] * 1000)(r)),
        ("batch-norm eps NaN", "port_batchnorm2d_forward_train", setf("fv", 0, math.nan)),
        ("batch-norm momentum 2", "port_batchnorm2d_forward_train", setf("fv", 1, 2.0)),
        ("dropout p = 1", "port_dropout_forward", setf("fv", 0, 1.0)),
        ("dropout p inf", "port_dropout_forward", setf("fv", 0, math.inf)),
        ("gelu approximation 7", "port_gelu_forward", setf("iv", 1, 7)),
        ("hardswish in place", "port_hardswish_forward", alias),
        ("maxpool padding > half the window", "port_maxpool2d_forward", setf("iv", 8, 5)),
        ("sgd count x 1000", "port_sgd_step", lambda r: setf("iv", 0, r.iv[0] * 1000)(r)),
        ("unknown flags", "port_relu_forward", lambda r: setattr(r, "flags", 4)),
        ("zero range past the arena", "port_relu_forward", lambda r: (setf("zero_offset", 0, A - 4)(r),
                                                                      setf("zero_bytes", 0, 8)(r))),
    ]


def test_embedding_padding_idx_out_of_range_is_refused():
    """port_embedding_backward_weight_pad's iv[3] (the padding row) must be a row of the weight: [0, v)."""
    tr = _trainer("pad_emb")
    prog = tr.program
    c = _call_of(prog, "port_embedding_backward_weight_pad")
    A = prog.arena_bytes
    r = rtcall.record(c, prog.slot)
    assert r.iv[3] == 0
    rtcall.check_record(r, c, A, prog.persistent_bytes)
    for bad in (-1, r.iv[1], 1 << 40):
        r.iv[3] = bad
        with pytest.raises(ProgramError, match=r"iv\[3\].*padding_idx must be in \[0, v\)"):
            rtcall.check_record(r, c, A, prog.persistent_bytes)


def test_avg_pool_ceil_mode_and_exclude_pad_rules():
    """An average pool's iv[14] ceil_mode and iv[15] exclude_pad are 0 or 1 and iv[12..13] (dilation) 0; ceil mode
    must give the output size the call names (iv[10..11]); a max pool takes no exclude_pad (issue 52)."""
    from port.ops.pooling import pool_out_hw
    tr = _trainer("avg_pools")
    prog = tr.program
    A, P = prog.arena_bytes, prog.persistent_bytes
    seen, flips = set(), 0
    for entry in ("port_avgpool2d_forward", "port_avgpool2d_backward_input"):
        for c in prog.calls:
            if c.backend != "c" or rtcall.encode(c, lambda t: prog.slot(t).shape).entry != entry:
                continue
            r0 = rtcall.record(c, prog.slot)
            rtcall.check_record(r0, c, A, P)
            seen.add((entry, r0.iv[14], r0.iv[15]))
            v = list(r0.iv)
            attrs = dict(kernel=(v[4], v[5]), stride=(v[6], v[7]), padding=(v[8], v[9]), ceil_mode=not v[14])
            flip_resizes = pool_out_hw((v[0], v[1], v[2], v[3]), attrs) != (v[10], v[11])
            flips += flip_resizes
            for i, bad, what in ((14, 2, "ceil_mode must be 0 or 1"), (15, 2, "exclude_pad must be 0 or 1"),
                                 (15, -1, "exclude_pad must be 0 or 1"), (12, 2, "takes no dilation"),
                                 (13, 1, "takes no dilation"), (14, 1 - v[14], "inconsistent pooling")):
                r = rtcall.record(c, prog.slot)
                r.iv[i] = bad
                if i == 14 and bad in (0, 1) and not flip_resizes:
                    rtcall.check_record(r, c, A, P)    # the other ceil mode, the same sizes: the same windows
                    continue
                with pytest.raises(ProgramError, match=what):
                    rtcall.check_record(r, c, A, P)
    assert flips >= 2
    assert {(e, ceil, excl) for e, ceil, excl in seen} >= {
        ("port_avgpool2d_forward", 1, 1), ("port_avgpool2d_forward", 0, 1), ("port_avgpool2d_forward", 1, 0),
        ("port_avgpool2d_backward_input", 1, 1), ("port_avgpool2d_backward_input", 0, 1)}
    mp = _call_of(_trainer("normpool").program, "port_maxpool2d_forward")
    prog = _trainer("normpool").program
    r = rtcall.record(mp, prog.slot)
    rtcall.check_record(r, mp, prog.arena_bytes, prog.persistent_bytes)
    r.iv[15] = 1
    with pytest.raises(ProgramError, match=r"iv\[15\].*takes no exclude_pad"):
        rtcall.check_record(r, mp, prog.arena_bytes, prog.persistent_bytes)


@pytest.fixture(scope="module", params=["zoo", "rng_attn"])
def zoo(request):
    tr = _trainer(request.param)
    data, _ = build_bundle(tr)
    return tr, bytes(data), request.param


def _bundle_with(data, index, record):
    b = bytearray(data)
    at = struct.unpack_from("<Q", b, 48)[0] + index * CALL_BYTES
    b[at:at + CALL_BYTES] = bytes(record)
    b[-32:] = hashlib.sha256(b[:-32]).digest()
    return bytes(b)


def _run_rt(binary, path):
    return subprocess.run([str(binary), "info", str(path)], capture_output=True, text=True, timeout=60)


def test_mutated_calls_are_refused_by_loader_and_check_program(zoo, port_rt, tmp_path):
    tr, data, name = zoo
    prog = tr.program
    A = struct.unpack_from("<Q", data, 24)[0]
    assert A == max(tr.program.arena_bytes, tr.eval_program.arena_bytes)
    for what, entry, mutate in _mutants(A, name):
        c = _call_of(prog, entry)
        r = rtcall.record(c, prog.slot)
        rtcall.check_record(r, c, A, prog.persistent_bytes)       # the unmutated call passes
        mutate(r)
        with pytest.raises(ProgramError, match=f"call {c.index} "):
            rtcall.check_record(r, c, A, prog.persistent_bytes)
            pytest.fail(f"{what}: not refused")
        p = tmp_path / "bad.portrt"
        p.write_bytes(_bundle_with(data, c.index, r))
        with pytest.raises(BundleError, match=f"call {c.index} "):
            check_bundle(p)
        out = _run_rt(port_rt, p)
        kernel = capi.raw.port_rt_kernel_name(r.kernel).decode()
        assert out.returncode == 2 and f"call {c.index} (kernel {r.kernel}, {kernel})" in out.stderr, \
            (what, out.returncode, out.stderr)


def test_check_program_applies_the_c_rule(monkeypatch):
    """check_program runs every C call through the C rule: a record's attributes and slots all check out in
    Python, but an encoder that disagrees with them (here relu's, claiming twice the elements: what a wrong
    encoder or a stale record would hand port-rt) is refused before anything runs, naming the call, the C kernel
    and the rule. The relu in the middle of the arena still writes inside it, so the rule refuses the pointer
    only once the count passes the arena's end: 2^28 elements."""
    from port.ops.base import Encoded
    tr = _trainer("zoo")
    prog = tr.program
    check_program(prog)
    good = rtcall.encode

    def bad(call, shape):
        e = good(call, shape)
        return Encoded(e.entry, e.ptrs, (1 << 28,) + tuple(e.iv[1:]), e.fv, e.state) if call.kernel == "relu" else e
    monkeypatch.setattr(rtcall, "encode", bad)
    c = next(c for c in prog.calls if c.backend == "c" and c.kernel == "relu")
    with pytest.raises(ProgramError, match=rf"call {c.index} \(.*port_relu_forward.*ptr\[0\].*outside the arena"):
        check_program(prog)


def test_bundle_state_is_checked(zoo, tmp_path):
    """The run state in the header (optimizer, lr, momentum, ...): a NaN learning rate is refused."""
    data = zoo[1]
    b = bytearray(data)
    struct.pack_into("<d", b, 176 + 8, math.nan)    # port_rt_state.lr
    b[-32:] = hashlib.sha256(b[:-32]).digest()
    p = tmp_path / "nan_lr.portrt"
    p.write_bytes(bytes(b))
    with pytest.raises(BundleError, match="lr"):
        check_bundle(p)
