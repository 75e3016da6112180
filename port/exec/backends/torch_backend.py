"""The ``torch-cpu`` / ``torch-cuda`` backends: the graph ops through torch (aten) calls on views of the arena.

Outputs are written into the arena views (``out=`` where aten has it, else ``copy_``); weight gradients
accumulate (``add_``) and input gradients overwrite, the same contract as the C kernels. Dropout draws its
mask from a torch.Generator seeded with the same per-call seed as the C backend (the masks differ between
backends; each is reproducible).
"""
from __future__ import annotations

import math
from typing import Callable

from port.errors import ProgramError


class TorchBackend:
    def __init__(self, device: str):
        self.device = device
        self.name = f"torch-{device}"

    def bind(self, call, ctx) -> Callable[[], None]:
        import torch
        import torch.nn.functional as F
        aten = torch.ops.aten
        kind = call.kernel
        a = dict(call.attrs)
        I = [ctx.view(t) for t in call.inputs]
        O = [ctx.view(t) for t in call.outputs]
        where = f"call {call.index} ({call.name}, {kind})"
        if call.variant not in ("plain", "inplace"):
            raise ProgramError(f"{where}: variant {call.variant!r} is not available on {self.name}")

        if kind == "conv2d":
            x, w = I[0], I[1]
            b = I[2] if a.get("bias") else None
            y = O[0]
            s, p, g = list(a["stride"]), list(a["padding"]), a["groups"]
            # out=: aten's convolution.out (no Python-side temporary; aten may still use an internal one)
            return lambda: aten.convolution.out(x, w, b, s, p, [1, 1], False, [0, 0], g, out=y)
        if kind in ("conv2d.grad_input", "conv2d.grad_weight"):
            s, p, g = list(a["stride"]), list(a["padding"]), a["groups"]
            if kind == "conv2d.grad_input":
                dy, w = I
                dx = O[0]

                def run():     # aten's convolution_backward.out refuses masked-out outputs: a copy
                    r = aten.convolution_backward(dy, dx, w, None, s, p, [1, 1], False, [0, 0], g,
                                                  [True, False, False])
                    dx.copy_(r[0])
                return run
            dy, x = I
            gr = dict(zip(a["grads"], O))
            dw, db = gr.get("weight"), gr.get("bias")
            wshape = [dy.shape[1], x.shape[1] // g, *a["kernel"]]
            wdummy = torch.empty(wshape, dtype=x.dtype, device=x.device)

            def run():
                r = aten.convolution_backward(dy, x, wdummy, [dy.shape[1]] if db is not None else None, s, p,
                                              [1, 1], False, [0, 0], g, [False, dw is not None, db is not None])
                if dw is not None:
                    dw.add_(r[1])
                if db is not None:
                    db.add_(r[2])
            return run
        if kind == "batch_norm2d":
            eps, mom = float(a["eps"]), float(a["momentum"])
            x, w, b, rm, rv = I
            if a.get("training"):
                y, stats = O[0], O[1]
                if a.get("recompute"):    # re-run during backward: running stats must not move again
                    rm = rv = None

                def run():     # out=: written straight into the arena slots
                    aten.native_batch_norm.out(x, w, b, rm, rv, True, mom, eps, out=y, save_mean=stats[0],
                                               save_invstd=stats[1])
                return run
            y = O[0]
            return lambda: y.copy_(F.batch_norm(x, rm, rv, w, b, False, 0.0, eps))
        if kind == "batch_norm2d.grad_input_from_output":
            # in-place BN: x was overwritten by y; x-hat = (y - beta) / gamma. ins (gy, y, stats, gamma, beta)
            dy, yv, stats, g_, b_ = I
            dx = O[0]
            c = yv.shape[1]
            training = bool(a.get("training"))

            def run():
                gm, bt = g_.view(1, c, 1, 1), b_.view(1, c, 1, 1)
                inv = stats[1].view(1, c, 1, 1)
                xhat = (yv - bt) / gm
                mdy = dy.mean((0, 2, 3), keepdim=True)
                mdyx = (dy * xhat).mean((0, 2, 3), keepdim=True)
                dx.copy_(gm * inv * (dy - mdy - xhat * mdyx))
            return run
        if kind == "batch_norm2d.grad_weight_from_output":   # ins (gy, y, gamma, beta)
            dy, yv, g_, b_ = I
            gr = dict(zip(a["grads"], O))
            dg, dbt = gr.get("weight"), gr.get("bias")
            c = yv.shape[1]

            def run():
                if dg is not None:
                    xhat = (yv - b_.view(1, c, 1, 1)) / g_.view(1, c, 1, 1)
                    dg.add_((dy * xhat).sum((0, 2, 3)))
                if dbt is not None:
                    dbt.add_(dy.sum((0, 2, 3)))
            return run
        if kind == "batch_norm2d.grad_input":
            eps = float(a["eps"])
            dx = O[0]
            if a.get("training"):
                dy, x, stats, w = I

                def run():     # (the .out overload refuses masked-out outputs: a copy)
                    r = aten.native_batch_norm_backward(dy, x, w, None, None, stats[0], stats[1], True, eps,
                                                        [True, False, False])
                    dx.copy_(r[0])
                return run
            dy, w, rv = I
            return lambda: torch.mul(dy, (w * torch.rsqrt(rv + eps)).view(1, -1, 1, 1), out=dx)
        if kind == "batch_norm2d.grad_weight":
            eps = float(a["eps"])
            gr = dict(zip(a["grads"], O))
            dg, dbt = gr.get("weight"), gr.get("bias")
            if a.get("training"):
                dy, x, stats = I
                # aten's batch-norm backward reduces sum(dy * x-hat) and sum(dy) in one pass over x and dy (no
                # x-hat temporary); neither depends on gamma, so a ones vector stands in for it
                ones = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
                mask = [False, dg is not None, dbt is not None]

                def run():
                    r = aten.native_batch_norm_backward(dy, x, ones, None, None, stats[0], stats[1], True, eps,
                                                        mask)
                    if dg is not None:
                        dg.add_(r[1])
                    if dbt is not None:
                        dbt.add_(r[2])
                return run
            dy, x, rm, rv = I

            def run():
                if dg is not None:
                    xhat = (x - rm.view(1, -1, 1, 1)) * torch.rsqrt(rv + eps).view(1, -1, 1, 1)
                    dg.add_((dy * xhat).sum((0, 2, 3)))
                if dbt is not None:
                    dbt.add_(dy.sum((0, 2, 3)))
            return run
        if kind == "relu":
            x, y = I[0], O[0]
            return lambda: torch.clamp(x, min=0.0, out=y)
        if kind == "relu6":
            x, y = I[0], O[0]
            return lambda: torch.clamp(x, 0.0, 6.0, out=y)
        if kind == "hardswish":
            x, y = I[0], O[0]
            return lambda: y.copy_(F.hardswish(x))
        if kind == "relu.grad_input":
            dy, yv = I
            dx = O[0]
            return lambda: aten.threshold_backward.grad_input(dy, yv, 0.0, grad_input=dx)
        if kind == "relu6.grad_input":
            dy, yv = I
            dx = O[0]
            return lambda: aten.hardtanh_backward.grad_input(dy, yv, 0.0, 6.0, grad_input=dx)
        if kind == "hardswish.grad_input":
            dy, x = I
            dx = O[0]
            return lambda: aten.hardswish_backward.out(dy, x, out=dx)
        if kind in ("add", "grad_accumulate"):
            p, q = I
            y = O[0]
            return lambda: torch.add(p, q, out=y)
        if kind == "dropout":
            from port.exec.registry import dropout_seed
            pr = float(a["p"])
            x = I[0]
            y, m = O
            st, op = ctx.state, call.op
            gen = torch.Generator(device=x.device)
            scale = 1.0 / (1.0 - pr)

            def run():
                gen.manual_seed(dropout_seed(st.seed, st.dropout_counter, op) & 0x7FFFFFFFFFFFFFFF)
                keep = torch.rand(x.shape, generator=gen, device=x.device) >= pr
                m.copy_(keep)
                torch.mul(x, keep, out=y)
                y.mul_(scale)
            return run
        if kind == "dropout.grad_input":
            pr = float(a["p"])
            dy, m = I
            dx = O[0]
            scale = 1.0 / (1.0 - pr)

            def run():
                torch.mul(dy, m, out=dx)
                dx.mul_(scale)
            return run
        if kind == "max_pool2d":
            x = I[0]
            y, idx = O
            k, s, p = list(a["kernel"]), list(a["stride"]), list(a["padding"])

            def run():     # out=: written straight into the arena slots
                aten.max_pool2d_with_indices.out(x, k, s, p, out=y, indices=idx)
            return run
        if kind == "max_pool2d.grad_input":
            dy, idx = I
            dx = O[0]
            k, s, p = list(a["kernel"]), list(a["stride"]), list(a["padding"])
            return lambda: aten.max_pool2d_with_indices_backward.grad_input(dy, dx, k, s, p, [1, 1], False, idx,
                                                                            grad_input=dx)
        if kind == "avg_pool2d":
            x, y = I[0], O[0]
            k, s, p = list(a["kernel"]), list(a["stride"]), list(a["padding"])
            return lambda: aten.avg_pool2d.out(x, k, s, p, False, True, None, out=y)
        if kind == "avg_pool2d.grad_input":
            dy = I[0]
            dx = O[0]
            k, s, p = list(a["kernel"]), list(a["stride"]), list(a["padding"])
            return lambda: aten.avg_pool2d_backward.grad_input(dy, dx, k, s, p, False, True, None, grad_input=dx)
        if kind == "global_avg_pool2d":
            x, y = I[0], O[0]
            return lambda: y.copy_(x.mean((2, 3)).view(y.shape))
        if kind == "global_avg_pool2d.grad_input":
            dy = I[0]
            dx = O[0]
            n, c, h, w = dx.shape
            return lambda: dx.copy_((dy.reshape(n, c, 1, 1) / (h * w)).expand(n, c, h, w))
        if kind.startswith("linear") and I[0].dim() > 2:     # [..., features]: the same call on [rows, features]
            I = [t.reshape(-1, t.shape[-1]) if t.dim() > 2 else t for t in I]
            O = [t.reshape(-1, t.shape[-1]) if t.dim() > 2 else t for t in O]
        if kind == "linear":
            x, w = I[0], I[1]
            y = O[0]
            if a.get("bias"):
                b = I[2]
                return lambda: torch.addmm(b, x, w.t(), out=y)
            return lambda: torch.mm(x, w.t(), out=y)
        if kind == "linear.grad_input":
            dy, w = I
            dx = O[0]
            return lambda: torch.mm(dy, w, out=dx)
        if kind == "linear.grad_weight":
            dy, x = I
            gr = dict(zip(a["grads"], O))
            dw, db = gr.get("weight"), gr.get("bias")

            def run():
                if dw is not None:
                    dw.addmm_(dy.t(), x)
                if db is not None:
                    db.add_(dy.sum(0))
            return run
        if kind in _SEQ:
            return _SEQ[kind](a, I, O, torch, F)
        if kind.startswith("torch_op"):
            return _torch_op(kind, a, I, O, ctx.state, call.op, torch)
        if kind in ("cross_entropy", "cross_entropy.grad_input") and "ignore_index" in a:
            return _token_xent(kind, a, I, O, torch, F)
        if kind == "cross_entropy":
            logits, labels = I
            loss, probs = O
            ls = float(a.get("label_smoothing", 0.0))

            def run():
                loss.copy_(F.cross_entropy(logits, labels, label_smoothing=ls))
                torch.softmax(logits, 1, out=probs)
            return run
        if kind == "cross_entropy.grad_input":
            probs, labels, scale = I
            dl = O[0]
            n, k = probs.shape
            ls = float(a.get("label_smoothing", 0.0))

            def run():
                tgt = torch.full_like(probs, ls / k)
                tgt.scatter_add_(1, labels.view(-1, 1), torch.full((n, 1), 1.0 - ls, dtype=probs.dtype,
                                                                   device=probs.device))
                torch.sub(probs, tgt, out=dl)
                dl.mul_(scale / n)
            return run
        if kind == "update":
            return self._update(call, ctx, I)
        raise ProgramError(f"{where}: the {self.name} backend has no implementation of {kind!r}")

    @staticmethod
    def update_graph_key(call, state) -> tuple | None:
        """The Python scalars ``call``'s update reads when it runs (a CUDA graph replays them as captured: the
        executor re-captures when they change), or None when they change every step (AdamW's bias corrections:
        not captured)."""
        o = state.opt
        if call.attr("optimizer") in ("sgd", "sgd_momentum"):
            return (state.step == 0, o.lr, o.weight_decay, getattr(o, "momentum", 0.0),
                    getattr(o, "dampening", 0.0), getattr(o, "nesterov", False))
        return None

    def _update(self, call, ctx, I):
        st = ctx.state
        opt = call.attr("optimizer")
        if opt in ("sgd", "sgd_momentum"):
            p, g = I[0], I[1]
            buf = I[2] if opt == "sgd_momentum" else None

            def run():
                o = st.opt
                d = g
                if o.weight_decay:
                    d = d.add(p, alpha=o.weight_decay)
                if buf is not None and o.momentum:
                    if st.step == 0:
                        buf.copy_(d)
                    else:
                        buf.mul_(o.momentum).add_(d, alpha=1.0 - o.dampening)
                    d = d.add(buf, alpha=o.momentum) if o.nesterov else buf
                p.add_(d, alpha=-o.lr)
            return run
        if opt == "adamw":
            p, g, m1, m2 = I

            def run():
                o = st.opt
                step = st.step + 1
                b1, b2 = o.betas
                p.mul_(1.0 - o.lr * o.weight_decay)
                m1.lerp_(g, 1.0 - b1)
                m2.mul_(b2).addcmul_(g, g, value=1.0 - b2)
                bc1 = 1.0 - b1 ** step
                bc2 = 1.0 - b2 ** step
                denom = (m2.sqrt() / math.sqrt(bc2)).add_(o.eps)
                p.addcdiv_(m1, denom, value=-(o.lr / bc1))
            return run
        raise ProgramError(f"call {call.index}: unknown optimizer {opt!r}")


# ---------------------------------------------------------------------------------------------
# sequence-model kernels (port.ir.seqops): (attrs, input views, output views, torch, F) -> run
# ---------------------------------------------------------------------------------------------
def _token_xent(kind, a, I, O, torch, F):
    ls, ign = float(a.get("label_smoothing", 0.0)), int(a["ignore_index"])
    if kind == "cross_entropy":
        logits, labels = I
        loss, probs = O
        k = logits.shape[-1]

        def run():
            z = logits.reshape(-1, k)
            loss.copy_(F.cross_entropy(z, labels.reshape(-1), ignore_index=ign, label_smoothing=ls))
            torch.softmax(z, 1, out=probs.view(-1, k))
        return run
    probs, labels, scale = I
    dl = O[0]
    k = probs.shape[-1]

    def run():
        p, y = probs.reshape(-1, k), labels.reshape(-1)
        keep = (y != ign)
        cnt = max(int(keep.sum()), 1)
        tgt = torch.full_like(p, ls / k)
        tgt.scatter_add_(1, y.clamp(0, k - 1).view(-1, 1),
                         torch.full((p.shape[0], 1), 1.0 - ls, dtype=p.dtype, device=p.device))
        d = (p - tgt) * keep.unsqueeze(1) * (scale / cnt)
        dl.view(-1, k).copy_(d)
    return run


def _ln(a, I, O, torch, F):
    x = I[0]
    aff = a["affine"]
    w = I[1] if "weight" in aff else None
    b = I[1 + (w is not None)] if "bias" in aff else None
    y, st = O
    d = x.shape[-1]

    def run():
        r = torch.ops.aten.native_layer_norm(x, [d], w, b, float(a["eps"]))
        y.copy_(r[0])
        st[0].copy_(r[1].reshape(-1))
        st[1].copy_(r[2].reshape(-1))
    return run


def _ln_back(a, I, O, torch, F, weight: bool):
    dy, x, st = I[0], I[1], I[2]
    d = x.shape[-1]
    lead = x.shape[:-1]

    def grads(w=None):
        mean, rstd = st[0].reshape(*lead, 1), st[1].reshape(*lead, 1)
        return torch.ops.aten.native_layer_norm_backward(
            dy, x, [d], mean, rstd, w if w is not None else torch.ones(d, dtype=x.dtype, device=x.device),
            torch.zeros(d, dtype=x.dtype, device=x.device), [not weight, weight, weight])
    if not weight:
        w = I[3] if len(I) > 3 else None
        dx = O[0]
        return lambda: dx.copy_(grads(w)[0])
    g = dict(zip(a["grads"], O))

    def run():
        r = grads()
        if "weight" in g:
            g["weight"].add_(r[1])
        if "bias" in g:
            g["bias"].add_(r[2])
    return run


def _attn(a, I, O, torch, F, backward: bool):
    aten = torch.ops.aten
    scale, causal, masked = float(a["scale"]), bool(a.get("causal")), bool(a.get("masked"))

    def bias(q, k, mask):
        """The additive mask (or None) of the math path: -inf at masked keys and above the causal diagonal."""
        if not masked and not causal:
            return None
        tq, tk = q.shape[2], k.shape[2]
        m = torch.zeros(q.shape[0], 1, tq, tk, dtype=q.dtype, device=q.device)
        if masked:
            m.masked_fill_(~mask.reshape(q.shape[0], 1, 1, tk), float("-inf"))
        if causal:
            m.masked_fill_(torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(tk - tq + 1), float("-inf"))
        return m

    if not backward:
        q, k, v = I[:3]
        mask = I[3] if masked else None
        o, lse = O

        def run():
            s = torch.matmul(q, k.transpose(-1, -2)) * scale
            bm = bias(q, k, mask)
            if bm is not None:
                s = s + bm
            l = torch.logsumexp(s, -1)
            p = torch.exp(s - l.unsqueeze(-1)).nan_to_num_(0.0)
            torch.matmul(p, v, out=o)
            lse.copy_(l)
        return run
    dout, q, k, v, o, lse = I[:6]
    mask = I[6] if masked else None
    g = dict(zip(a["grads"], O))

    def run():
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        bm = bias(q, k, mask)
        if bm is not None:
            s = s + bm
        p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num_(0.0)
        dp = torch.matmul(dout, v.transpose(-1, -2))
        ds = p * (dp - (dout * o).sum(-1, keepdim=True))
        if 0 in g:
            torch.matmul(ds, k, out=g[0]).mul_(scale)
        if 1 in g:
            torch.matmul(ds.transpose(-1, -2), q, out=g[1]).mul_(scale)
        if 2 in g:
            torch.matmul(p.transpose(-1, -2), dout, out=g[2])
    return run


def _perm(a, I, O, torch, inverse: bool):
    from port.ir.seqops import inverse_perm
    p = list(inverse_perm(a["perm"]) if inverse else a["perm"])
    x, y = I[0], O[0]
    return lambda: y.copy_(x.permute(p))


def _gelu_back(a, I, O, torch, F):
    dy, x = I
    dx = O[0]
    return lambda: torch.ops.aten.gelu_backward.grad_input(dy, x, approximate=a["approximate"], grad_input=dx)


def _emb_back(a, I, O, torch, F):
    dy, idx = I
    dw = O[0]
    d = dw.shape[1]
    return lambda: dw.index_add_(0, idx.reshape(-1), dy.reshape(-1, d))


def _mm_back(a, I, O, torch, F):
    gy, other = I
    out = O[0]
    if a["operand"] == 0:
        return lambda: torch.matmul(gy, other.transpose(-1, -2), out=out)
    return lambda: torch.matmul(other.transpose(-1, -2), gy, out=out)


_SEQ = {
    "embedding": lambda a, I, O, torch, F: (lambda: torch.index_select(I[1], 0, I[0].reshape(-1),
                                                                       out=O[0].view(-1, I[1].shape[1]))),
    "embedding.grad_weight": _emb_back,
    "layer_norm": _ln,
    "layer_norm.grad_input": lambda a, I, O, torch, F: _ln_back(a, I, O, torch, F, False),
    "layer_norm.grad_weight": lambda a, I, O, torch, F: _ln_back(a, I, O, torch, F, True),
    "gelu": lambda a, I, O, torch, F: (lambda: O[0].copy_(F.gelu(I[0], approximate=a["approximate"]))),
    "gelu.grad_input": _gelu_back,
    "tanh": lambda a, I, O, torch, F: (lambda: torch.tanh(I[0], out=O[0])),
    "tanh.grad_input": lambda a, I, O, torch, F: (
        lambda: torch.ops.aten.tanh_backward.grad_input(I[0], I[1], grad_input=O[0])),
    "softmax": lambda a, I, O, torch, F: (lambda: torch.softmax(I[0], -1, out=O[0])),
    "softmax.grad_input": lambda a, I, O, torch, F: (
        lambda: torch.ops.aten._softmax_backward_data.out(I[0], I[1], -1, I[0].dtype, out=O[0])),
    "scale": lambda a, I, O, torch, F: (lambda: torch.mul(I[0], float(a["alpha"]), out=O[0])),
    "scale.grad_input": lambda a, I, O, torch, F: (lambda: torch.mul(I[0], float(a["alpha"]), out=O[0])),
    "permute": lambda a, I, O, torch, F: _perm(a, I, O, torch, False),
    "permute.grad_input": lambda a, I, O, torch, F: _perm(a, I, O, torch, True),
    "matmul": lambda a, I, O, torch, F: (lambda: torch.matmul(I[0], I[1], out=O[0])),
    "matmul.grad_input": _mm_back,
    "attention": lambda a, I, O, torch, F: _attn(a, I, O, torch, F, False),
    "attention.grad_input": lambda a, I, O, torch, F: _attn(a, I, O, torch, F, True),
    "add_bcast": lambda a, I, O, torch, F: (lambda: torch.add(I[0], I[1], out=O[0])),
    "add_bcast.grad_input": lambda a, I, O, torch, F: (
        lambda: O[0].copy_(I[0].reshape(-1, O[0].numel()).sum(0).view(O[0].shape))),
    "mean_mid": lambda a, I, O, torch, F: (lambda: torch.mean(I[0], a["dim"], out=O[0])),
    "mean_mid.grad_input": lambda a, I, O, torch, F: (
        lambda: O[0].copy_((I[0].unsqueeze(a["dim"]) / O[0].shape[a["dim"]]).expand(O[0].shape))),
    "arange": lambda a, I, O, torch, F: (lambda: torch.arange(int(a.get("start", 0)), int(a.get("start", 0))
                                                              + O[0].numel(), out=O[0])),
    "ne_scalar": lambda a, I, O, torch, F: (lambda: torch.ne(I[0], int(a["value"]), out=O[0])),
}


# ---------------------------------------------------------------------------------------------
# torch_op (port.ir.capture): an aten op PORT has no kind for, run by PyTorch with PyTorch's derivative
# ---------------------------------------------------------------------------------------------
def _seeded(random: bool, st, op: int, torch):
    """A context that seeds torch's generator for a random aten op from the run's seed, the forward-pass counter
    and the op (as dropout's masks): a re-run in the same step draws the same values."""
    import contextlib
    if not random:
        return contextlib.nullcontext()
    from port.exec.registry import dropout_seed

    @contextlib.contextmanager
    def ctx():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(dropout_seed(st.seed, st.dropout_counter, op) & 0x7FFFFFFFFFFFFFFF)
            yield
    return ctx()


def _torch_op(kind, a, I, O, st, op, torch):
    """Forward: the aten call on the input views, its result copied into the output's arena slot (aten allocates
    it: the torch engine's transient memory). Backward (``grads``: input positions): the call re-run under
    autograd on the saved inputs and differentiated by PyTorch (torch.autograd.grad); input gradients overwrite
    their slots, weight gradients (``torch_op.grad_weight``) accumulate."""
    from port.ir.capture import make_call
    random = bool(a.get("random"))
    if kind == "torch_op":
        dev = O[0].device if O else (I[0].device if I else None)
        fn = make_call(a["call"], dev)
        y = O[0]

        def run():
            with torch.no_grad(), _seeded(random, st, op, torch):
                y.copy_(fn(I))
        return run
    fn = make_call(a["call"], I[0].device)
    grads = tuple(a["grads"])
    acc = kind == "torch_op.grad_weight"
    gy, xs = I[0], I[1:]

    def run():
        with torch.enable_grad(), _seeded(random, st, op, torch):
            leaves = [x.detach().requires_grad_(True) if i in grads else x for i, x in enumerate(xs)]
            out = fn(leaves)
            gs = torch.autograd.grad(out, [leaves[i] for i in grads], gy, allow_unused=True)
        for o, g in zip(O, gs):
            if g is None:
                if not acc:
                    o.zero_()
            elif acc:
                o.add_(g.reshape(o.shape))
            else:
                o.copy_(g.reshape(o.shape))
    return run
