"""The ``c`` backend (reached through port.exec.registry): PORT's C kernel library through ``port.exec.kernels.raw`` (ctypes, integer addresses).

Every pointer, param struct and size is computed once at bind time; a bound call is a closure doing one
ctypes call and a status check. Arguments follow the header: outputs, inputs, params, workspace.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable

from port.errors import ProgramError
from port.ir.types import numel

from port.exec.registry import CONV_ALGO as ALGO, conv_geometry as _conv_x_and_cout


def _k():
    from port.exec import kernels
    return kernels


def _conv_params(k, x_shape, c_out, attrs):
    from port.exec.registry import conv_params
    return conv_params(k, x_shape, c_out, attrs)


class CBackend:
    """Kernel threads follow port.exec.kernels.set_num_threads (one OpenMP pool shared with torch)."""
    name = "c"

    def bind(self, call, ctx) -> Callable[[], None]:
        k = _k()
        raw = k.raw
        check = k.check
        kind = call.kernel
        a = dict(call.attrs)
        I = [ctx.ptr(t) for t in call.inputs]
        O = [ctx.ptr(t) for t in call.outputs]
        IS = [ctx.shape(t) for t in call.inputs]
        OS = [ctx.shape(t) for t in call.outputs]
        ws, wsb = ctx.ws_ptr(call), call.workspace_bytes
        where = f"call {call.index} ({call.name}, {kind})"
        keep: list[Any] = []       # keep structs alive with the closure

        def chk(fn, *args):
            def run():
                st = fn(*args)
                if st:
                    check(st, where)
            run.entry = fn.__name__
            return run

        variant = call.variant
        if kind in ("conv2d", "conv2d.grad_input", "conv2d.grad_weight", "conv2d_bn_relu"):
            x_shape, co = _conv_x_and_cout(kind, IS, OS)
            p = _conv_params(k, x_shape, co, a)
            # the output dims the y/dy slot has: the kernel refuses params that imply others
            p.h_out, p.w_out = (OS[0] if kind in ("conv2d", "conv2d_bn_relu") else IS[0])[2:4]
            pp = ctypes.pointer(p)
            keep.append(p)
            algo = ALGO.get(variant, 0)
            tile = int(variant[5:]) if variant.startswith("patch") else 0
            if kind == "conv2d":
                b = I[2] if a.get("bias") else None
                if tile:
                    return chk(raw.port_conv2d_patch_forward, O[0], I[0], I[1], b, pp, tile, tile, ws, wsb)
                return chk(raw.port_conv2d_forward, O[0], I[0], I[1], b, pp, algo, ws, wsb)
            if kind == "conv2d.grad_input":
                if tile:
                    return chk(raw.port_conv2d_patch_backward_input, O[0], I[0], I[1], pp, tile, tile, ws, wsb)
                return chk(raw.port_conv2d_backward_input, O[0], I[0], I[1], pp, algo, ws, wsb)
            if kind == "conv2d.grad_weight":
                g = dict(zip(a["grads"], O))
                dw, db = g.get("weight"), g.get("bias")
                if tile:
                    return chk(raw.port_conv2d_patch_backward_weight, dw, db, I[0], I[1], pp, tile, tile, ws, wsb)
                if dw is None:   # only the bias trains: db += sum(dy)
                    return self._bias_only(call, ctx)
                return chk(raw.port_conv2d_backward_weight, dw, db, I[0], I[1], pp, algo, ws, wsb)
            # fused: outs (y, z, stats, rm, rv), ins (x, w, gamma, beta, rm, rv)
            C = OS[2][1]
            return chk(raw.port_conv2d_bn_relu_forward_train, O[0], O[1], O[2], O[2] + 4 * C, O[3], O[4],
                       I[0], I[1], I[2], I[3], pp, float(a["eps"]), float(a["momentum"]), 0, ws, wsb)

        if kind.startswith("batch_norm2d"):
            x_shape = IS[0] if kind == "batch_norm2d" else (OS[0] if kind.endswith("grad_input") else IS[1])
            if kind.endswith("_from_output"):
                x_shape = IS[1]
            if kind == "batch_norm2d.grad_input" and len(IS) == 3 and not a.get("training"):
                x_shape = OS[0]
            n, c, h, w = x_shape
            p = k.BatchNormParams(n, c, h, w, float(a["eps"]), float(a["momentum"]))
            pp = ctypes.pointer(p)
            keep.append(p)
            tr = bool(a.get("training"))
            if kind == "batch_norm2d":
                if tr:  # outs (y, stats, rm, rv); ins (x, w, b, rm, rv)
                    if a.get("recompute"):   # re-run during backward: same y/stats, running stats untouched
                        return chk(raw.port_batchnorm2d_forward_train, O[0], O[1], O[1] + 4 * c, None, None,
                                   I[0], I[1], I[2], pp)
                    return chk(raw.port_batchnorm2d_forward_train, O[0], O[1], O[1] + 4 * c, I[3], I[4],
                               I[0], I[1], I[2], pp)
                return chk(raw.port_batchnorm2d_forward_eval, O[0], I[0], I[1], I[2], I[3], I[4], pp)
            if kind == "batch_norm2d.grad_input_from_output":   # ins (gy, y, stats, gamma, beta)
                return chk(raw.port_batchnorm2d_backward_input_from_output, O[0], I[0], I[1], I[3], I[4],
                           I[2] + 4 * c, pp)
            if kind == "batch_norm2d.grad_weight_from_output":  # ins (gy, y, gamma, beta)
                g = dict(zip(a["grads"], O))
                return chk(raw.port_batchnorm2d_backward_weight_from_output, g.get("weight"), g.get("bias"),
                           I[0], I[1], I[2], I[3], pp)
            if kind == "batch_norm2d.grad_input":
                if tr:  # ins (gy, x, stats, weight)
                    return chk(raw.port_batchnorm2d_backward_input, O[0], I[0], I[1], I[3], I[2], I[2] + 4 * c, pp)
                return chk(raw.port_batchnorm2d_backward_input_eval, O[0], I[0], I[1], I[2], pp)
            if kind == "batch_norm2d.grad_weight":
                g = dict(zip(a["grads"], O))
                if tr:  # ins (gy, x, stats)
                    return chk(raw.port_batchnorm2d_backward_weight, g.get("weight"), g.get("bias"), I[0], I[1],
                               I[2], I[2] + 4 * c, pp)
                # ins (gy, x, rm, rv)
                return chk(raw.port_batchnorm2d_backward_weight_eval, g.get("weight"), g.get("bias"), I[0], I[1],
                           I[2], I[3], pp)

        if kind in ("relu", "relu6", "hardswish"):
            return chk(getattr(raw, f"port_{kind}_forward"), O[0], I[0], numel(OS[0]))
        if kind in ("relu.grad_input", "relu6.grad_input", "hardswish.grad_input"):
            return chk(getattr(raw, f"port_{kind.split('.')[0]}_backward"), O[0], I[0], I[1], numel(OS[0]))
        if kind in ("add", "grad_accumulate"):
            return chk(raw.port_add, O[0], I[0], I[1], numel(OS[0]))
        if kind == "dropout":
            pr = float(a["p"])
            y, m, x, cnt, st, op = O[0], O[1], I[0], numel(OS[0]), ctx.state, call.op
            fn = raw.port_dropout_forward
            from port.exec.registry import dropout_seed

            def run():
                s = fn(y, m, x, cnt, pr, dropout_seed(st.seed, st.dropout_counter, op))
                if s:
                    check(s, where)
            run.entry = fn.__name__
            return run
        if kind == "dropout.grad_input":
            return chk(raw.port_dropout_backward, O[0], I[0], I[1], numel(OS[0]), float(a["p"]))
        if kind in ("max_pool2d", "avg_pool2d", "max_pool2d.grad_input", "avg_pool2d.grad_input"):
            x_shape = IS[0] if "." not in kind else OS[0]
            n, c, h, w = x_shape
            kh, kw = a["kernel"]
            sh, sw = a["stride"]
            ph, pw = a["padding"]
            y_shape = OS[0] if "." not in kind else IS[0]
            p = k.Pool2dParams(n, c, h, w, kh, kw, sh, sw, ph, pw, y_shape[2], y_shape[3])
            pp = ctypes.pointer(p)
            keep.append(p)
            if kind == "max_pool2d":
                return chk(raw.port_maxpool2d_forward, O[0], O[1], I[0], pp)
            if kind == "max_pool2d.grad_input":
                return chk(raw.port_maxpool2d_backward_input, O[0], I[0], I[1], pp)
            if kind == "avg_pool2d":
                return chk(raw.port_avgpool2d_forward, O[0], I[0], pp)
            return chk(raw.port_avgpool2d_backward_input, O[0], I[0], pp)
        if kind == "global_avg_pool2d":
            n, c, h, w = IS[0]
            return chk(raw.port_global_avgpool_forward, O[0], I[0], n, c, h * w)
        if kind == "global_avg_pool2d.grad_input":
            n, c, h, w = OS[0]
            return chk(raw.port_global_avgpool_backward_input, O[0], I[0], n, c, h * w)
        if kind.startswith("linear"):
            if kind == "linear":
                n, fin = IS[0]
                fout = IS[1][0]
                p = k.LinearParams(n, fin, fout)
                keep.append(p)
                return chk(raw.port_linear_forward, O[0], I[0], I[1], I[2] if a.get("bias") else None,
                           ctypes.pointer(p))
            if kind == "linear.grad_input":
                n, fin = OS[0]
                fout = IS[1][0]
                p = k.LinearParams(n, fin, fout)
                keep.append(p)
                return chk(raw.port_linear_backward_input, O[0], I[0], I[1], ctypes.pointer(p))
            n, fin = IS[1]
            fout = IS[0][1]
            p = k.LinearParams(n, fin, fout)
            keep.append(p)
            g = dict(zip(a["grads"], O))
            if g.get("weight") is None:
                return self._bias_only(call, ctx)
            return chk(raw.port_linear_backward_weight, g.get("weight"), g.get("bias"), I[0], I[1],
                       ctypes.pointer(p))
        if kind in ("cross_entropy", "cross_entropy.grad_input"):
            n, kk = IS[0]   # ins (logits, labels) / (probs, labels, grad_scale)
            ls = float(a.get("label_smoothing", 0.0))
            if kind == "cross_entropy":
                fn, args = raw.port_softmax_xent_forward, (O[0], O[1], I[0], I[1], n, kk, ls)
            else:
                fn, args = raw.port_softmax_xent_backward, (O[0], I[0], I[1], I[2], n, kk, ls)
            lab_tid = call.inputs[1]

            def run():
                st = fn(*args)
                if st:
                    from port.errors import LabelError
                    y = ctx.view(lab_tid).reshape(-1)
                    bad = ((y < 0) | (y >= kk)).nonzero()
                    if st == k.PORT_ERR_ARG and len(bad):
                        i = int(bad[0])
                        raise LabelError(f"{where}: label {int(y[i])} at index {i} of the batch is not a class "
                                         f"index: expected 0 <= label < num_classes = {kk}")
                    check(st, where)
            run.entry = fn.__name__
            return run
        if kind == "update":
            return self._update(call, ctx, I, IS)
        raise ProgramError(f"{where}: the c backend has no kernel for {kind!r} (variant {variant})")

    def _bias_only(self, call, ctx):
        """Weight grad when only the bias is trainable: db += sum(dy) over all but the channel dim (torch)."""
        dy = ctx.view(call.inputs[0])
        db = ctx.view(call.outputs[0])
        dims = [0] + list(range(2, dy.dim()))

        def run():
            db.add_(dy.sum(dims))
        run.entry = "torch.sum+add_ (bias-only weight gradient)"
        return run

    def _update(self, call, ctx, I, IS):
        k = _k()
        raw, check = k.raw, k.check
        st = ctx.state
        cnt = numel(IS[0])
        where = f"call {call.index} ({call.name}, update)"
        opt = call.attr("optimizer")
        if opt in ("sgd", "sgd_momentum"):
            p, g = I[0], I[1]
            m = I[2] if opt == "sgd_momentum" else None
            fn = raw.port_sgd_step

            def run():
                o = st.opt
                s = fn(p, m, g, cnt, o.lr, o.momentum if m else 0.0, o.dampening, o.weight_decay,
                       1 if o.nesterov else 0, 1 if st.step == 0 else 0)
                if s:
                    check(s, where)
            run.entry = fn.__name__
            return run
        if opt == "adamw":
            p, g, m1, m2 = I
            fn = raw.port_adamw_step

            def run():
                o = st.opt
                s = fn(p, m1, m2, g, cnt, o.lr, o.betas[0], o.betas[1], o.eps, o.weight_decay, st.step + 1)
                if s:
                    check(s, where)
            run.entry = fn.__name__
            return run
        raise ProgramError(f"{where}: unknown optimizer {opt!r}")
