"""The sequence-model op kinds (transformers): what each takes and saves. port.ir.trace's capture rules map
the aten ops of an embedding, layer norm, GELU, tanh, softmax, matmul, scaled dot-product attention, permute,
scaling, broadcast add, mean, arange or ``!=`` to them.

Kinds and what they save for backward (PyTorch autograd's choice for the plain kernels):

==================  =====================================================  ===========================
kind                inputs -> outputs                                      saved
==================  =====================================================  ===========================
embedding           idx int64 [...], weight [V, D] -> y [..., D]          idx (weight gradient)
layer_norm          x [..., D], weight?, bias? -> y, stats [2, rows]      x, stats, weight
gelu                x -> y (attr approximate: "none" | "tanh")            x
tanh                x -> y                                                 y
softmax             x [..., D] -> y (last dim)                             y
scale               x -> alpha * x                                         (nothing)
permute             x -> x.permute(perm) (a copy: kernels read contiguous) (nothing)
matmul              a [B.., M, K], b [B.., K, N] -> c [B.., M, N]         b (for da), a (for db)
attention           q [N, H, Tq, d], k, v [N, H, Tk, d], mask? [N,1,1,Tk]  q, k, v, o, lse, mask
                    -> o [N, H, Tq, d], lse [N, H, Tq]
add_bcast           a [..., S], b [S] (b's shape a suffix of a's) -> y     (nothing)
mean_mid            x [O, M, I] -> mean over M                             (nothing)
arange              () -> int64 [T]                                        (no gradient)
ne_scalar           x int64 -> bool (x != value)                           (no gradient)
==================  =====================================================  ===========================
"""
from __future__ import annotations


MULTI_GRAD_KINDS = ("matmul", "attention")     # one grad_input op writes the gradients of several inputs
NO_GRAD_KINDS = ("arange", "ne_scalar")        # integer outputs


def inverse_perm(perm) -> tuple[int, ...]:
    """The permutation that undoes ``perm`` (a permute's gradient permutes back with it)."""
    inv = [0] * len(perm)
    for i, j in enumerate(perm):
        inv[j] = i
    return tuple(inv)

