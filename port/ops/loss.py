"""cross_entropy: softmax cross-entropy with mean reduction and label smoothing, over logits [N, K] with int64
labels, or token-level over [N, T, vocab] skipping ``ignore_index``. The forward writes the loss and the
softmax probabilities, which the input gradient reads (with the loss-gradient scale, 1 / micro-batches).
Backward assembly adds it after the forward ops (it is not captured from the model).
"""
from __future__ import annotations

from port.ir.types import numel
from port.ops import register
from port.ops.base import F32, I64, CallShapeError, Encoded, OpRecord


def _shapes(k, attrs, I, O, at):
    z = at(I, 0, "input 0 (logits)")
    if z is None or len(z) != (3 if "ignore_index" in attrs else 2):
        raise CallShapeError(f"logits has shape {list(z) if z is not None else None}: expected "
                             f"{3 if 'ignore_index' in attrs else 2} dims")
    ls = attrs.get("label_smoothing", 0.0)
    if not isinstance(ls, float) or not 0.0 <= ls <= 1.0:
        raise CallShapeError(f"attribute label_smoothing={ls!r}: expected a float in [0, 1]")
    if "ignore_index" in attrs and type(attrs["ignore_index"]) is not int:
        raise CallShapeError(f"attribute ignore_index={attrs['ignore_index']!r}: expected an int")
    Z, lab = (tuple(z), F32), (tuple(z[:-1]), I64)
    if k == "cross_entropy":
        return [Z, lab], [((), F32), Z]
    return [Z, lab, ((1,), F32)], [Z]


def _encode(kind, a, IS, OS, I, O, variant, call):
    fv = (float(a.get("label_smoothing", 0.0)),)
    if "ignore_index" in a:
        k = IS[0][-1]
        iv = (numel(IS[0]) // k, k, int(a["ignore_index"]))
        if kind == "cross_entropy":
            return Encoded("port_softmax_xent_ignore_forward", (O[0], O[1], I[0], I[1]), iv, fv)
        return Encoded("port_softmax_xent_ignore_backward", (O[0], I[0], I[1], I[2]), iv, fv)
    n, k = IS[0]   # ins (logits, labels) / (probs, labels, grad_scale)
    if kind == "cross_entropy":
        return Encoded("port_softmax_xent_forward", (O[0], O[1], I[0], I[1]), (n, k), fv)
    return Encoded("port_softmax_xent_backward", (O[0], I[0], I[1], I[2]), (n, k), fv)


def _token_torch(kind, a, I, O, torch, F):
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


def _torch(kind, a, I, O, env):
    torch, F = env.torch, env.F
    if "ignore_index" in a:
        return _token_torch(kind, a, I, O, torch, F)
    ls = float(a.get("label_smoothing", 0.0))
    if kind == "cross_entropy":
        logits, labels = I
        loss, probs = O

        def run():
            loss.copy_(F.cross_entropy(logits, labels, label_smoothing=ls))
            torch.softmax(logits, 1, out=probs)
        return run
    probs, labels, scale = I
    dl = O[0]
    n, k = probs.shape

    def run():
        tgt = torch.full_like(probs, ls / k)
        tgt.scatter_add_(1, labels.view(-1, 1), torch.full((n, 1), 1.0 - ls, dtype=probs.dtype, device=probs.device))
        torch.sub(probs, tgt, out=dl)
        dl.mul_(scale / n)
    return run


def _calls(graph, op, variant):
    """The input gradient also reads the loss-gradient scale (1 / micro-batches: a constant slot)."""
    if op.kind != "cross_entropy.grad_input":
        return None
    from port.lower.program import GRAD_SCALE_ID
    return [(op.kind, op.outputs, op.inputs + (GRAD_SCALE_ID,), dict(op.attrs), ())]


register(OpRecord(
    kind="cross_entropy", family="loss", calls=_calls,
    kernels={"cross_entropy": ("port_softmax_xent_forward", "port_softmax_xent_ignore_forward"),
             "cross_entropy.grad_input": ("port_softmax_xent_backward", "port_softmax_xent_ignore_backward")},
    shapes=_shapes, torch=_torch, encode=_encode, doc=__doc__))
