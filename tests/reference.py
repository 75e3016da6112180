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


def flop_counts(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(forward, backward) FLOPs of one training step per FlopCounterMode (with the upstream groups fix)."""
    mapping = {torch.ops.aten.convolution_backward: _conv_backward_flop_groups_fixed}
    y = torch.randint(0, 10, (x.shape[0],))
    with fc.FlopCounterMode(display=False, custom_mapping=mapping) as c:
        out = model(x)
    fwd = c.get_total_flops()
    loss = F.cross_entropy(out, y)
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

    y = torch.randint(0, 10, (x.shape[0],))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
        F.cross_entropy(out, y)
    return sum(seen.values())
