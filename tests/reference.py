"""PyTorch's own accounting, used as the oracle for the graph's figures."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils import flop_counter as fc


def _conv_backward_flop_groups_fixed(grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation,
                                     transposed, output_padding, groups, output_mask, out_shape, **kw):
    """torch 2.13's FlopCounterMode counts a grouped convolution's weight gradient `groups` times too
    many (its transposed-shape formula loses the group division). Upstream fixed it in
    pytorch/pytorch#183405 by dividing that term by groups; this applies the same fix to the same code."""
    gi = fc.conv_backward_flop(grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed,
                               output_padding, groups, [output_mask[0], False], out_val=out_shape)
    gw = fc.conv_backward_flop(grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed,
                               output_padding, groups, [False, output_mask[1]], out_val=out_shape)
    return gi + gw // groups


def _sdpa_cpu(q, k, v, *args, out_shape=None, **kw):
    """FlopCounterMode registers the CUDA attention kernels, not the CPU one SDPA runs here: count it with
    torch's own SDPA formula (two batched GEMMs)."""
    return fc.sdpa_flop_count(q, k, v)


def _sdpa_cpu_backward(grad_out, q, k, v, *args, out_shape=None, **kw):
    """As _sdpa_cpu for the backward: torch's formula (the scores recomputed, then four GEMMs)."""
    return fc.sdpa_backward_flop_count(grad_out, q, k, v)


def _loss(out: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [N, K] (labels < min(K, 10)) or token logits [N, T, V] (labels [N, T])."""
    k = out.shape[-1]
    y = torch.randint(0, min(k, 10), out.shape[:-1])
    return F.cross_entropy(out.reshape(-1, k), y.reshape(-1))


def flop_counts(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(forward, backward) FLOPs of one training step per FlopCounterMode (with the upstream groups fix)."""
    mapping = {torch.ops.aten.convolution_backward: _conv_backward_flop_groups_fixed,
               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward}
    with fc.FlopCounterMode(display=False, custom_mapping=mapping) as c:
        out = model(x)
    fwd = c.get_total_flops()
    loss = _loss(out)
    with fc.FlopCounterMode(display=False, custom_mapping=mapping) as c:
        loss.backward()
    return fwd, c.get_total_flops()


def saved_activation_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Unique storage bytes autograd saves for backward in one forward + loss, excluding parameters and
    buffers (they are alive anyway)."""
    state = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        if st.data_ptr() not in state and st.nbytes() > 0:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
        _loss(out)
    return sum(seen.values())
