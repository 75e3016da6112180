"""Random ops, all drawn from PORT's one generator (kernels/src/rng.c; the same function here, in plain Python as
the reference and vectorised in torch for the torch engines):

    Philox4x32-10 (Salmon et al., SC'11; Random123). Element e of a call draws the 32-bit word e % 4 of
    Philox4x32-10 with key (seed & 0xffffffff, seed >> 32) and counter (e/4 & 0xffffffff, e/4 >> 32,
    stream & 0xffffffff, stream >> 32), where seed is the run's seed and stream = ``rng_stream(forward passes
    done, graph op id of the forward op)``. A draw u keeps an element of dropout(p) iff u >= ceil(p 2^32) and
    is a one of bernoulli(q) iff u < ceil(q 2^32) (p, q rounded to float32 first, as the C kernels take them).

So a mask does not depend on the thread count or the backend (C, torch, port-rt), and a backward or a re-run in
the same pass can draw its forward's values again (attention dropout keeps no mask).

* ``dropout`` (``dropout``/``native_dropout`` in training with 0 < p < 1; at p = 0 or in eval a view): the mask
  is saved as uint8 and read by the backward. Never recomputed.
* ``bernoulli`` (``bernoulli_(q)`` of an ``empty``/``new_empty`` tensor: stochastic depth's per-sample keep
  mask, timm's DropPath and torchvision's StochasticDepth): float32 ones and zeros; no gradient.
* attention dropout: port/ops/attention.py (``dropout_p`` of scaled_dot_product_attention).
"""
from __future__ import annotations

import math
import struct

from port.ir.types import ROLE_ACTIVATION, numel
from port.ops import register
from port.ops.base import F32, U8, CallShapeError, Encoded, OpRecord, arg, float32, fwd, unit_float

_M32 = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def rng_stream(counter: int, op: int) -> int:
    """The stream of a random call: (forward passes done mod 2^32) | (forward op id mod 2^32) << 32
    (port_rt_rng_stream)."""
    return (int(counter) & _M32) | ((int(op) & _M32) << 32)


def dropout_seed(base_seed: int, counter: int, op: int) -> int:
    """torch's generator seed for a random aten op PORT has no kernel for (a torch_op): a 64-bit mix of (run seed,
    forward-pass counter, op id) (splitmix64). PORT's own random ops draw from the generator above."""
    z = (base_seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9 + op * 0x94D049BB133111EB + 1) \
        & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def philox4x32_10(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """One Philox4x32-10 block in plain Python (the reference)."""
    c0, c1, c2, c3 = (int(c) & _M32 for c in ctr)
    k0, k1 = (int(k) & _M32 for k in key)
    for _ in range(10):
        p0, p1 = PHILOX_M[0] * c0, PHILOX_M[1] * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _M32, p1 & _M32, ((p0 >> 32) ^ c3 ^ k1) & _M32, p0 & _M32
        k0, k1 = (k0 + PHILOX_W[0]) & _M32, (k1 + PHILOX_W[1]) & _M32
    return c0, c1, c2, c3


def draws_reference(seed: int, stream: int, count: int, offset: int = 0) -> list[int]:
    """The draws of elements offset .. offset + count - 1, in plain Python."""
    key = (seed & _M32, (seed >> 32) & _M32)
    out, block, words = [], None, ()
    for e in range(offset, offset + count):
        if e >> 2 != block:
            block = e >> 2
            words = philox4x32_10((block & _M32, block >> 32, stream & _M32, (stream >> 32) & _M32), key)
        out.append(words[e & 3])
    return out


def threshold(p: float) -> int:
    """ceil(p 2^32) of p rounded to float32 (0 for p <= 0, 2^32 for p >= 1): the integer a draw is compared with."""
    p32 = struct.unpack("f", struct.pack("f", float(p)))[0]
    if not p32 > 0.0:
        return 0
    return 1 << 32 if p32 >= 1.0 else math.ceil(p32 * 4294967296.0)


def _mulhilo(torch, m: int, x):
    """(hi, lo) 32-bit halves of m * x for x < 2^32 in int64 without overflow (x split into 16-bit halves)."""
    xh, xl = x >> 16, x & 0xFFFF
    ph, pl = xh * m, xl * m                        # each < 2^48
    lo = (((ph & 0xFFFF) << 16) + pl) & _M32
    hi = ((ph + (pl >> 16)) >> 16) & _M32
    return hi, lo


def draws(torch, seed: int, stream: int, count: int, device=None):
    """The draws of elements 0 .. count - 1 as an int64 tensor (values < 2^32), vectorised in torch (any
    device): the same bits as draws_reference and the C kernels."""
    nb = (int(count) + 3) // 4
    q = torch.arange(nb, dtype=torch.int64, device=device)
    c0, c1 = q & _M32, q >> 32
    c2 = torch.full_like(q, stream & _M32)
    c3 = torch.full_like(q, (stream >> 32) & _M32)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        h0, l0 = _mulhilo(torch, PHILOX_M[0], c0)
        h1, l1 = _mulhilo(torch, PHILOX_M[1], c2)
        c0, c1, c2, c3 = h1 ^ c1 ^ k0, l1, h0 ^ c3 ^ k1, l0
        k0, k1 = (k0 + PHILOX_W[0]) & _M32, (k1 + PHILOX_W[1]) & _M32
    return torch.stack((c0, c1, c2, c3), -1).reshape(-1)[:count]


def keep_mask(torch, seed: int, stream: int, shape, p: float, device=None):
    """dropout(p)'s keep mask (bool, ``shape``): draw >= threshold(p)."""
    return (draws(torch, seed, stream, numel(tuple(shape)), device) >= threshold(p)).reshape(tuple(shape))


def call_stream(env, op: int | None = None) -> tuple[int, int]:
    """(seed, stream) of a torch-engine call from its run state (op: the forward op, default the call's own)."""
    st = env.state
    return int(st.seed) & 0xFFFFFFFFFFFFFFFF, rng_stream(st.dropout_counter, env.op if op is None else op)


def _f32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", float(v)))[0]


# ---------------------------------------------------------------------------------------------
# dropout
# ---------------------------------------------------------------------------------------------
def _capture(ctx):
    """native_dropout(x, p, train) -> (y, mask); dropout(x, p, train) -> y."""
    from port.ir import capture as C
    n = ctx.node
    x = ctx.t(n.args[0])
    p, train = float(arg(n, 1, "p")), arg(n, 2, "train", True)
    if not train or p == 0.0:
        if n.target._overloadpacket.__name__ == "native_dropout":
            ctx.multi[n.name] = {0: x}
            return None
        return ctx.alias(x)
    if not float32(ctx, x) or not 0.0 < p < 1.0:
        return False
    v = C.val_of(n)
    y = ctx.out(val=v[0] if isinstance(v, (tuple, list)) else v)
    mask = ctx.b.tensor(f"{ctx.opname}:mask", ctx.shape(y), U8, ROLE_ACTIVATION)
    if isinstance(v, (tuple, list)):
        ctx.multi[n.name] = {0: y}
    return fwd(ctx, "dropout", dict(p=p), (x,), (y, mask), 0, 2 * numel(ctx.shape(y)))


def _shapes(k, attrs, I, O, at):
    x = at(I, 0, "input 0 (x)" if k == "dropout" else "input 0 (dy)")
    unit_float(attrs, "p")
    if k == "dropout":
        return [(x, F32)], [(x, F32), (x, U8)]
    return [(x, F32), (x, U8)], [(x, F32)]


def _encode(kind, a, IS, OS, I, O, variant, call):
    if kind == "dropout":
        return Encoded("port_dropout_forward", (O[0], O[1], I[0]), (numel(OS[0]),), (float(a["p"]),), True)
    return Encoded("port_dropout_backward", (O[0], I[0], I[1]), (numel(OS[0]),), (float(a["p"]),))


def _torch(kind, a, I, O, env):
    torch = env.torch
    pr = _f32(a["p"])
    scale = _f32(1.0 / (1.0 - pr))
    if kind == "dropout.grad_input":
        dy, m = I
        dx = O[0]

        def run():
            torch.mul(dy, m, out=dx)
            dx.mul_(scale)
        return run
    x = I[0]
    y, m = O

    def run():
        seed, stream = call_stream(env)
        keep = keep_mask(torch, seed, stream, x.shape, pr, x.device)
        m.copy_(keep)
        torch.mul(x, keep, out=y)
        y.mul_(scale)
    return run


register(OpRecord(
    kind="dropout", family="random",
    kernels={"dropout": ("port_dropout_forward",), "dropout.grad_input": ("port_dropout_backward",)},
    shapes=_shapes, torch=_torch, encode=_encode, aten=("dropout", "native_dropout"), capture=_capture,
    saved=lambda f, gi, gw, w: (f.outputs[1],), grad_input_reads=lambda f: (f.outputs[1],),
    bwd_vector_flops=lambda f, T: numel(T[f.outputs[0]].shape), tags=frozenset({"not_recomputable", "run_state"}),
    doc=__doc__))


# ---------------------------------------------------------------------------------------------
# bernoulli: stochastic depth's keep mask (x.new_empty(shape).bernoulli_(keep_prob))
# ---------------------------------------------------------------------------------------------
def _only_bernoulli_users(node) -> bool:
    return bool(node.users) and all(hasattr(u.target, "_overloadpacket") and
                                    u.target._overloadpacket.__name__ in ("bernoulli", "bernoulli_") and
                                    u.args and u.args[0] is node for u in node.users)


def _empty_capture(ctx):
    """An ``empty``/``new_empty`` tensor only a bernoulli fills: nothing to run (bernoulli writes every element)."""
    from port.ir import capture as C
    v = C.val_of(ctx.node)
    if not _only_bernoulli_users(ctx.node) or C.dtype_name(v.dtype) != F32:
        return False
    return None


def _bernoulli_capture(ctx):
    """bernoulli(x, p) / bernoulli_(x, p) with a float p: x's shape of ones with probability p (x is not read);
    the ``empty``/``new_empty`` it fills is captured as nothing."""
    from port.ir import capture as C
    n = ctx.node
    if n.target._overloadpacket.__name__ in ("empty", "new_empty"):
        return _empty_capture(ctx)
    p = arg(n, 1, "p")
    if not isinstance(p, float) or isinstance(p, bool) or not 0.0 <= p <= 1.0 or arg(n, 2, "generator") is not None:
        return False
    src = n.args[0]
    if not (hasattr(src, "name") and (src.name in ctx.env or _only_bernoulli_users(src))):
        return False
    v = C.val_of(n)
    if C.dtype_name(v.dtype) != F32:
        return False
    y = ctx.out(val=v)
    return fwd(ctx, "bernoulli", dict(p=p), (), (y,), 0, numel(ctx.shape(y)))


def _bernoulli_shapes(k, attrs, I, O, at):
    p = attrs.get("p")
    if not isinstance(p, float) or not 0.0 <= p <= 1.0:
        raise CallShapeError(f"attribute p={p!r}: expected a float in [0, 1]")
    return [], [(at(O, 0, "output 0"), F32)]


def _bernoulli_torch(kind, a, I, O, env):
    torch = env.torch
    y = O[0]
    t = threshold(a["p"])

    def run():
        seed, stream = call_stream(env)
        y.copy_((draws(torch, seed, stream, y.numel(), y.device) < t).reshape(y.shape))
    return run


register(OpRecord(
    kind="bernoulli", family="random", kernels={"bernoulli": ("port_bernoulli_forward",)},
    shapes=_bernoulli_shapes, torch=_bernoulli_torch,
    encode=lambda k, a, IS, OS, I, O, v, call: Encoded("port_bernoulli_forward", (O[0],), (numel(OS[0]),),
                                                       (float(a["p"]),), True),
    aten=("bernoulli", "bernoulli_", "empty", "new_empty"), capture=_bernoulli_capture,
    tags=frozenset({"no_grad", "run_state"}),
    doc="bernoulli: float32 ones with probability p (stochastic depth's per-sample keep mask); PORT's generator "
        "(port/ops/random.py): a re-run in the same pass draws the same values."))
