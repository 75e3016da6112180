"""The C-kernel runner: graph ops through PORT's C library (port.kernels' raw fast path).

Buffers (inputs, outputs, workspace) are torch CPU tensors allocated once by ``prepare``; ``run()`` is
one ctypes call with cached integer pointers and prebuilt param structs (what the executor does).
Workspace comes from the kernel's own ``*_workspace_bytes`` query and is reported as
``PreparedOp.workspace_bytes``.
"""
from __future__ import annotations

from typing import Any, Callable

from ..errors import ProfileError
from ..types import Graph, Op, numel
from .. import variants as V
from .runners import PreparedOp, Runner, SGD_DEFAULTS, ADAMW_DEFAULTS

_K: Any = None


def _kernels():
    global _K
    if _K is None:
        from .. import kernels as K  # noqa: WPS433 - import on first use (loads the .so)
        _K = K
    return _K


NEEDED = ("conv2d_forward", "conv2d_backward_input", "conv2d_backward_weight", "conv2d_workspace_bytes",
          "conv2d_patch_forward", "conv2d_patch_workspace_bytes", "batchnorm2d_forward_train",
          "relu_forward", "maxpool2d_forward", "linear_forward", "softmax_xent_forward", "sgd_step",
          "adamw_step", "conv2d_bn_relu_forward_train")


class CRunner(Runner):
    backend = "c"

    def __init__(self, graph: Graph, threads: int | None = None, seed: int = 0,
                 optimizer_kwargs: dict | None = None) -> None:
        import torch
        ok, why = self.available()
        if not ok:
            raise ProfileError(f"C kernels not built: {why}")
        K = _kernels()
        self.torch = torch
        if threads:
            K.set_num_threads(int(threads))   # kernel OpenMP + BLAS (+ torch intra-op) threads
        super().__init__(graph, K.get_num_threads())
        self.K = K
        self.gen = torch.Generator().manual_seed(seed)
        self.optimizer_kwargs = optimizer_kwargs or {}

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            K = _kernels()
        except Exception as e:  # noqa: BLE001 - ImportError, OSError from the loader
            return False, f"port.kernels not importable ({type(e).__name__}: {e})"
        missing = [n for n in NEEDED if not hasattr(K.raw, n)]
        if missing:
            return False, f"port.kernels lacks {', '.join(missing)}"
        return True, ""

    # -- buffers ------------------------------------------------------------------------------
    def _rand(self, shape, dtype="float32", positive=False, high=None):
        torch = self.torch
        shape = tuple(int(s) for s in shape)
        if dtype == "float32":
            t = torch.randn(shape, generator=self.gen)
            return t.abs_().add_(0.5) if positive else t
        if dtype == "int64":
            return torch.randint(0, high or 2, shape, generator=self.gen, dtype=torch.int64)
        if dtype == "uint8":
            return torch.randint(0, 2, shape, generator=self.gen, dtype=torch.uint8)
        raise ProfileError(f"C runner: unsupported dtype {dtype}")

    def _empty(self, shape, dtype="float32"):
        torch = self.torch
        return torch.zeros(tuple(int(s) for s in shape), dtype=getattr(torch, dtype))

    def shape(self, tid: int):
        return self.graph.tensors[tid].shape

    # -- ops ----------------------------------------------------------------------------------
    def prepare(self, op: Op, variant: str = "plain") -> PreparedOp:
        fn, keep, ws = self._build(op, variant)
        st = fn()
        if st:  # check once; the timed path does not
            raise ProfileError(f"C kernel for {op.name} ({op.kind}, {variant}) failed: "
                               f"{self.K.status_string(int(st))} (status {st})")
        return PreparedOp(fn, op, variant, self.backend, int(ws), tuple(keep))

    def _build(self, op: Op, variant: str) -> tuple[Callable[[], Any], list, int]:
        K, raw = self.K, self.K.raw
        g = self.graph
        k = op.kind
        a = op.attr_dict
        fwd = g.ops[op.forward_op] if op.forward_op is not None else op
        fa = fwd.attr_dict
        R, E = self._rand, self._empty
        P = lambda t: t.data_ptr()  # noqa: E731

        if k in ("reshape", "reshape.grad_input", "add.grad_input"):
            return (lambda: 0), [], 0          # views: zero-copy, no kernel
        if variant == "fused" and k != "conv2d":
            return (lambda: 0), [], 0          # computed by the fused conv kernel

        if k in V.CONV_KINDS:
            return self._conv(op, fwd, variant)

        if k == "batch_norm2d":
            xs = self.shape(op.inputs[0])
            x, gm, bt = R(xs), R(self.shape(op.inputs[1])), R(self.shape(op.inputs[2]))
            has_rs = len(op.inputs) > 3
            rm = R(self.shape(op.inputs[3])) if has_rs else None
            rv = R(self.shape(op.inputs[4]), positive=True) if has_rs else None
            y = x if variant == "inplace" else E(xs)
            c = xs[1]
            sm, si = E((c,)), E((c,))
            bp = K.BatchNormParams(*[int(s) for s in xs], float(a["eps"]), float(a["momentum"]))
            py, px, pg, pb = P(y), P(x), P(gm), P(bt)
            prm, prv = (P(rm), P(rv)) if has_rs else (None, None)
            if a["training"]:
                psm, psi = P(sm), P(si)
                f = raw.port_batchnorm2d_forward_train
                return (lambda: f(py, psm, psi, prm, prv, px, pg, pb, bp)), [x, y, gm, bt, rm, rv, sm, si, bp], 0
            f = raw.port_batchnorm2d_forward_eval
            return (lambda: f(py, px, pg, pb, prm, prv, bp)), [x, y, gm, bt, rm, rv, bp], 0
        if k in ("batch_norm2d.grad_input", "batch_norm2d.grad_weight"):
            fi = fwd.inputs
            xs = self.shape(fi[0])
            c = xs[1]
            x, dy, gm, bt = R(xs), R(xs), R((c,)), R((c,))
            rm, rv = R((c,)), R((c,), positive=True)
            bp = K.BatchNormParams(*[int(s) for s in xs], float(fa["eps"]), float(fa["momentum"]))
            out = E(xs)
            dg, db = E((c,)), E((c,))
            keep = [x, dy, gm, bt, rm, rv, out, dg, db, bp]
            if fa["training"]:
                y, sm, si = E(xs), E((c,)), E((c,))
                raw.port_batchnorm2d_forward_train(P(y), P(sm), P(si), None, None, P(x), P(gm), P(bt), bp)
                keep += [y, sm, si]
                if k.endswith("grad_input"):
                    f, args = raw.port_batchnorm2d_backward_input, (P(out), P(dy), P(x), P(gm), P(sm), P(si), bp)
                else:
                    f, args = raw.port_batchnorm2d_backward_weight, (P(dg), P(db), P(dy), P(x), P(sm), P(si), bp)
            else:
                if k.endswith("grad_input"):
                    f, args = raw.port_batchnorm2d_backward_input_eval, (P(out), P(dy), P(gm), P(rv), bp)
                else:
                    f, args = raw.port_batchnorm2d_backward_weight_eval, (P(dg), P(db), P(dy), P(x), P(rm), P(rv), bp)
            return (lambda: f(*args)), keep, 0

        if k in ("relu", "relu6", "hardswish"):
            xs = self.shape(op.inputs[0])
            x = R(xs)
            y = x if variant == "inplace" else E(xs)
            f = {"relu": raw.port_relu_forward, "relu6": raw.port_relu6_forward,
                 "hardswish": raw.port_hardswish_forward}[k]
            n, py, px = numel(xs), P(y), P(x)
            return (lambda: f(py, px, n)), [x, y], 0
        if k in ("relu.grad_input", "relu6.grad_input", "hardswish.grad_input"):
            xs = self.shape(op.inputs[0])
            dy, s, dx = R(xs), R(xs), E(xs)
            f = {"relu.grad_input": raw.port_relu_backward, "relu6.grad_input": raw.port_relu6_backward,
                 "hardswish.grad_input": raw.port_hardswish_backward}[k]
            n, a1, a2, a3 = numel(xs), P(dx), P(dy), P(s)
            return (lambda: f(a1, a2, a3, n)), [dy, s, dx], 0

        if k in ("max_pool2d", "avg_pool2d", "max_pool2d.grad_input", "avg_pool2d.grad_input"):
            xs = self.shape(fwd.inputs[0])
            kk, s, p = fa["kernel"], fa["stride"], fa["padding"]
            pp = K.Pool2dParams(*[int(v) for v in xs], kk[0], kk[1], s[0], s[1], p[0], p[1])
            ys = self.shape(fwd.outputs[0])
            x, y, dx, dy = R(xs), E(ys), E(xs), R(ys)
            idx = E(ys, "int64")
            if k.startswith("max"):
                raw.port_maxpool2d_forward(P(y), P(idx), P(x), pp)
            keep = [x, y, dx, dy, idx, pp]
            if k == "max_pool2d":
                f, args = raw.port_maxpool2d_forward, (P(y), P(idx), P(x), pp)
            elif k == "avg_pool2d":
                f, args = raw.port_avgpool2d_forward, (P(y), P(x), pp)
            elif k == "max_pool2d.grad_input":
                f, args = raw.port_maxpool2d_backward_input, (P(dx), P(dy), P(idx), pp)
            else:
                f, args = raw.port_avgpool2d_backward_input, (P(dx), P(dy), pp)
            return (lambda: f(*args)), keep, 0
        if k in ("global_avg_pool2d", "global_avg_pool2d.grad_input"):
            xs = self.shape(fwd.inputs[0])
            n, c, hw = xs[0], xs[1], xs[2] * xs[3]
            x, y = (R(xs), E((n, c))) if k == "global_avg_pool2d" else (E(xs), R((n, c)))
            if k == "global_avg_pool2d":
                f, args = raw.port_global_avgpool_forward, (P(y), P(x), n, c, hw)
            else:
                f, args = raw.port_global_avgpool_backward_input, (P(x), P(y), n, c, hw)
            return (lambda: f(*args)), [x, y], 0

        if k in ("linear", "linear.grad_input", "linear.grad_weight"):
            xs, ws_ = self.shape(fwd.inputs[0]), self.shape(fwd.inputs[1])
            ys = self.shape(fwd.outputs[0])
            lp = K.LinearParams(xs[0], xs[1], ws_[0])
            has_b = bool(fa.get("bias"))
            x, w, b, y, dy, dx, dw, db = R(xs), R(ws_), R((ws_[0],)), E(ys), R(ys), E(xs), E(ws_), E((ws_[0],))
            keep = [x, w, b, y, dy, dx, dw, db, lp]
            if k == "linear":
                f, args = raw.port_linear_forward, (P(y), P(x), P(w), P(b) if has_b else None, lp)
            elif k == "linear.grad_input":
                f, args = raw.port_linear_backward_input, (P(dx), P(dy), P(w), lp)
            else:
                f, args = raw.port_linear_backward_weight, (P(dw), P(db) if has_b else None, P(dy), P(x), lp)
            return (lambda: f(*args)), keep, 0

        if k in ("add", "grad_accumulate"):
            xs = self.shape(op.inputs[0])
            x1, x2 = R(xs), R(xs)
            y = x1 if variant == "inplace" else E(xs)
            f, args = raw.port_add, (P(y), P(x1), P(x2), numel(xs))
            return (lambda: f(*args)), [x1, x2, y], 0

        if k in ("dropout", "dropout.grad_input"):
            xs = self.shape(fwd.inputs[0])
            pr = float(fa["p"])
            x, y, mask = R(xs), E(xs), R(xs, "uint8")
            n = numel(xs)
            if k == "dropout":
                f, args = raw.port_dropout_forward, (P(y), P(mask), P(x), n, pr, 1234)
            else:
                f, args = raw.port_dropout_backward, (P(y), P(x), P(mask), n, pr)
            return (lambda: f(*args)), [x, y, mask], 0

        if k in ("cross_entropy", "cross_entropy.grad_input"):
            ls = self.shape(fwd.inputs[0])
            n, kc = ls
            logits, labels = R(ls), R((n,), "int64", high=kc)
            probs, loss, dl, go = E(ls), E((1,)), E(ls), self.torch.ones(1)
            raw.port_softmax_xent_forward(P(loss), P(probs), P(logits), P(labels), n, kc,
                                          float(fa.get("label_smoothing", 0.0)))
            lsm = float(fa.get("label_smoothing", 0.0))
            if k == "cross_entropy":
                f, args = raw.port_softmax_xent_forward, (P(loss), P(probs), P(logits), P(labels), n, kc, lsm)
            else:
                f, args = raw.port_softmax_xent_backward, (P(dl), P(probs), P(labels), P(go), n, kc, lsm)
            return (lambda: f(*args)), [logits, labels, probs, loss, dl, go], 0

        if k == "update":
            opt = a["optimizer"]
            ps = self.shape(op.inputs[0])
            p, gr = R(ps), R(ps)
            states = [R(ps, positive=True) for _ in op.inputs[2:]]
            kw = self.optimizer_kwargs
            n = numel(ps)
            if opt in ("sgd", "sgd_momentum"):
                mom = kw.get("momentum", SGD_DEFAULTS["momentum"]) if opt == "sgd_momentum" else 0.0
                f = raw.port_sgd_step
                args = (P(p), P(states[0]) if states else None, P(gr), n, kw.get("lr", SGD_DEFAULTS["lr"]),
                        mom, 0.0, kw.get("weight_decay", SGD_DEFAULTS["weight_decay"]), 0, 0)
            else:
                b1, b2 = kw.get("betas", ADAMW_DEFAULTS["betas"])
                f = raw.port_adamw_step
                args = (P(p), P(states[0]), P(states[1]), P(gr), n, kw.get("lr", ADAMW_DEFAULTS["lr"]), b1, b2,
                        kw.get("eps", ADAMW_DEFAULTS["eps"]), kw.get("weight_decay", ADAMW_DEFAULTS["weight_decay"]), 10)
            return (lambda: f(*args)), [p, gr] + states, 0
        raise ProfileError(f"C runner: no kernel for op kind {k!r} (op {op.name})")

    def _conv(self, op: Op, fwd: Op, variant: str):
        K, raw, g = self.K, self.K.raw, self.graph
        R, E = self._rand, self._empty
        P = lambda t: t.data_ptr()  # noqa: E731
        fa = fwd.attr_dict
        xs, wsh = self.shape(fwd.inputs[0]), self.shape(fwd.inputs[1])
        ys = self.shape(fwd.outputs[0])
        kk, s, p, gr = fa["kernel"], fa["stride"], fa["padding"], fa["groups"]
        cp = K.Conv2dParams(xs[0], xs[1], xs[2], xs[3], wsh[0], kk[0], kk[1], s[0], s[1], p[0], p[1], gr)
        has_b = bool(fa.get("bias"))
        x, w, b, y, dy, dx, dw, db = R(xs), R(wsh), R((wsh[0],)), E(ys), R(ys), E(xs), E(wsh), E((wsh[0],))
        keep = [x, w, b, y, dy, dx, dw, db, cp]
        k = op.kind
        tile = V.patch_tile(variant)
        if variant == "fused":
            if k != "conv2d":
                raise ProfileError(f"variant 'fused' applies to the forward conv2d only (op {op.name})")
            chain = V.fusion_chain(g, op)
            bn = g.ops[chain[1]]
            c = wsh[0]
            gm, bt = R((c,)), R((c,))
            nbytes = int(raw.port_conv2d_workspace_bytes(cp, K.CONV_AUTO))
            ws = self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8)
            keep += [gm, bt, ws]
            if bn.attr("training"):
                z, sm, si = E(ys), E((c,)), E((c,))
                rm, rv = E((c,)), R((c,), positive=True)
                keep += [z, sm, si, rm, rv]
                f = raw.port_conv2d_bn_relu_forward_train
                args = (P(y), P(z), P(sm), P(si), P(rm), P(rv), P(x), P(w), P(gm), P(bt), cp,
                        float(bn.attr("eps")), float(bn.attr("momentum")), K.CONV_AUTO, P(ws), nbytes)
            else:
                relu = 1 if len(chain) > 2 else 0
                f = raw.port_conv2d_bn_relu_forward_frozen
                args = (P(y), P(x), P(w), P(b), cp, relu, K.CONV_AUTO, P(ws), nbytes)
            return (lambda: f(*args)), keep, nbytes
        if tile is not None:
            nbytes = int(raw.port_conv2d_patch_workspace_bytes(cp, tile, tile))
            ws = self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8)
            keep.append(ws)
            pw, pn = P(ws), nbytes
            if k == "conv2d":
                f, args = raw.port_conv2d_patch_forward, (P(y), P(x), P(w), P(b) if has_b else None, cp, tile, tile, pw, pn)
            elif k == "conv2d.grad_input":
                f, args = raw.port_conv2d_patch_backward_input, (P(dx), P(dy), P(w), cp, tile, tile, pw, pn)
            else:
                f, args = raw.port_conv2d_patch_backward_weight, (P(dw), P(db) if has_b else None, P(dy), P(x), cp, tile, tile, pw, pn)
            return (lambda: f(*args)), keep, nbytes
        algo = {"plain": K.CONV_IM2COL, "direct": K.CONV_DIRECT}.get(variant)
        if algo is None:
            raise ProfileError(f"C runner: unknown conv variant {variant!r} (op {op.name})")
        nbytes = int(raw.port_conv2d_workspace_bytes(cp, algo))
        ws = self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8)
        keep.append(ws)
        pw, pn = P(ws), nbytes
        if k == "conv2d":
            f, args = raw.port_conv2d_forward, (P(y), P(x), P(w), P(b) if has_b else None, cp, algo, pw, pn)
        elif k == "conv2d.grad_input":
            f, args = raw.port_conv2d_backward_input, (P(dx), P(dy), P(w), cp, algo, pw, pn)
        else:
            f, args = raw.port_conv2d_backward_weight, (P(dw), P(db) if has_b else None, P(dy), P(x), cp, algo, pw, pn)
        return (lambda: f(*args)), keep, nbytes
