"""The implementation variants PORT chooses among, and where each is legal. One vocabulary for the
profiler (what to measure), the solver (what to choose), the simulator and the executor (what to run).

Variant names
-------------
``plain``        the reference implementation (for conv2d on the C backend: im2col + GEMM)
``direct``       conv2d without im2col: depthwise (groups == C_in == C_out) or 1x1/stride 1/pad 0
``patch<T>``     conv2d computed in row bands of H_out // T whole output rows, im2col per band: the workspace
                 is at most 1/T of the image's im2col matrix (no output buffer: a band of whole rows is
                 contiguous in y and dy), at the price of T times as many, T times smaller GEMMs
``winograd``     conv2d (forward and both gradients) as Winograd F(2x2, 3x3): 16 GEMMs over channels in the
                 transformed domain, 2.25x fewer multiply-adds than the direct sum, a larger workspace
                 (the transformed kernels plus a chunk of transformed tiles). 3x3, stride 1, groups 1,
                 padding <= 2, rows that fit the kernel's stack buffers: the C library decides.
``inplace``      the output is written into the input's buffer (relu, relu6, batch_norm2d, add; and the
                 element-wise input gradients relu/relu6/gelu/tanh.grad_input: dx over dy):
                 the output tensor aliases the input storage. On a batch norm's backward ops
                 (grad_weight; grad_input in training mode) ``inplace`` means "from the output": the
                 forward ran in place, so x-hat is rebuilt from y, gamma and beta. They run ``inplace``
                 exactly when their forward batch norm does (port.plan.semantics.coupled_variants).
``tiled``        scaled dot-product attention (forward or backward) computed FlashAttention-style: an online
                 softmax over key blocks that never materialises the T x T scores (the backward recomputes them
                 block by block from q, k and the saved log-sum-exp); ``plain`` holds every head's scores in
                 its workspace and runs GEMMs. Both save the same tensors (q, k, v, o, lse), so forward and
                 backward choose independently: the ILP weighs workspace against time. ``tiled`` is the
                 default plan's choice on the C backend (faster, and its workspace is per thread).
``fused``        conv2d (no bias) -> training batch_norm2d -> relu executed as one kernel (the C
                 library's conv2d_bn_relu) by the conv op; the batch-norm and relu ops then carry
                 variant ``fused`` and run no call of their own. Only chains that kernel computes are
                 fusable: no variant is offered that the executor cannot run.

Torch backends (torch-cpu, torch-cuda, torch-mps) run ``plain`` only, plus ``inplace`` for relu, relu6, add and the
element-wise input gradients,
and for a batch norm's backward ops (from the output). ``modeled`` accelerators get every variant the C
backend has. Every variant offered here is one the executor runs (port.exec.registry).

Legality (pure functions of the graph, used by solver, simulator and lowering alike)
--------------------------------------------------------------------------------------
* relu6's plain backward reads its input (as autograd); in place, it reads its output, whose mask
  (0 < v < 6) is the same.
* ``inplace`` on op o with input x: x is read by no op after o in the forward/loss phases, and x is not
  saved for backward by any forward op other than o itself (relu/relu6 save their output, so their own
  backward is unaffected; in-place batch norm saves its output y and reconstructs x-hat from y, gamma,
  beta: requires gamma != 0). For add, the output aliases the first input.
* ``fused`` on a conv2d without bias: its output feeds exactly one op, a training-mode batch_norm2d, whose
  output feeds exactly one relu, all forward.
* in-place batch norm needs affine weight and bias (it rebuilds x-hat from the output).
* ``inplace`` on an element-wise input gradient (BACKWARD_INPLACE_KINDS): dy is an activation gradient on its
  own root, as large as dx, read by no later op and not the op's other input.
* ``patch<T>`` on conv2d ops whose output has more than T rows.
* a re-run (not a variant: Plan.inplace_reruns) of relu, relu6 or add may write over its first input when
  ``rerun_inplace_inputs`` names it (read by that op alone); port.plan.semantics says when.
* ``winograd`` where the C library runs it (``winograd_legal`` asks port_conv2d_resolve_algo).
"""
from __future__ import annotations

from port import ops
from port.ir.types import PHASE_FORWARD, PHASE_LOSS, Graph, Op

PATCH_TILES = (4, 8)
TORCH_BACKENDS = ("torch-cpu", "torch-cuda", "torch-mps")
# the kind tuples the rules below read, from the op records' tags (port.ops.base.TAGS)
INPLACE_KINDS = ops.with_tag("inplace")
# element-wise input gradients whose ``inplace`` writes dx over dy (the kernels allow dx == dy)
BACKWARD_INPLACE_KINDS = tuple(f"{k}.grad_input" for k in ops.with_tag("backward_inplace"))
RERUN_INPLACE_KINDS = ops.with_tag("rerun_inplace")   # elementwise, with an ``inplace`` call on every backend
CONV_KINDS = tuple(k for c in ops.with_tag("conv_variants") for k in ops.op_kinds(c))
ATTENTION_KINDS = tuple(k for c in ops.with_tag("tiled_variant") for k in ops.op_kinds(c))


def _conv_attrs(op: Op) -> tuple[int, int, int, int, int]:
    k = op.attr("kernel")
    s = op.attr("stride")
    p = op.attr("padding")
    return k[0], k[1], s[0], p[0], op.attr("groups")


def is_depthwise(graph: Graph, op: Op) -> bool:
    fwd = graph.ops[op.forward_op] if op.forward_op is not None else op
    x = graph.tensors[fwd.inputs[0]]
    y = graph.tensors[fwd.outputs[0]]
    return fwd.attr("groups") == x.shape[1] == y.shape[1]


def is_pointwise(graph: Graph, op: Op) -> bool:
    fwd = graph.ops[op.forward_op] if op.forward_op is not None else op
    kh, kw, s, p, g = _conv_attrs(fwd)
    return kh == kw == 1 and s == 1 and p == 0 and g == 1


def winograd_legal(graph: Graph, op: Op) -> bool:
    """The C library's Winograd F(2x2, 3x3) convolution applies to this conv (or its gradient): asked of the C
    library itself (port_conv2d_resolve_algo), which owns the rule (3x3, stride 1, groups 1, padding <= 2, rows
    that fit its stack buffers)."""
    fwd = graph.ops[op.forward_op] if op.forward_op is not None else op
    if tuple(fwd.attr("kernel")) != (3, 3) or tuple(fwd.attr("stride")) != (1, 1) or fwd.attr("groups") != 1:
        return False                                   # the common refusals without a library call
    from port.exec import registry
    return registry.c_conv_algo(graph, op, "winograd") == "winograd"


def inplace_legal(graph: Graph, op: Op) -> bool:
    if not graph.owns(op):
        return _inplace_legal(graph, op)
    return graph.memo(("inplace_legal", op.id), lambda: _inplace_legal(graph, op))


def _inplace_legal(graph: Graph, op: Op) -> bool:
    if op.kind in BACKWARD_INPLACE_KINDS:
        return _backward_inplace_legal(graph, op)
    if op.phase != PHASE_FORWARD or op.kind not in INPLACE_KINDS:
        return False
    x = op.inputs[0]
    if graph.tensors[x].alias_of is not None or graph.tensors[x].role != "activation":
        return False
    if op.kind == "batch_norm2d" and (len(op.inputs) < 3 or
                                      any(graph.tensors[t].role != "parameter" for t in op.inputs[1:3])):
        return False
    on_x = lambda ts: any(graph.storage_root(t) == x for t in ts)      # noqa: E731 (x or a view of it)
    for other in graph.ops:
        if other.phase not in (PHASE_FORWARD, PHASE_LOSS):
            continue
        if other.id > op.id and on_x(other.inputs):
            return False
        if other.id != op.id and on_x(other.saved):
            return False
        if other.id == op.id and op.kind == "add" and op.inputs[1] == x:
            return False
    return True


def _backward_inplace_legal(graph: Graph, op: Op) -> bool:
    """dx may take dy's bytes: dy (input 0) is an activation gradient stored on its own root, as large as dx,
    that no later op reads (through any view) and that is not also the op's other input."""
    if not op.inputs or not op.outputs:
        return False
    dy, dx = op.inputs[0], op.outputs[0]
    tdy, tdx = graph.tensors[dy], graph.tensors[dx]
    if tdy.alias_of is not None or tdx.alias_of is not None or tdy.role != "gradient" or tdy.bytes != tdx.bytes:
        return False
    if tdy.grad_of is None or graph.tensors[tdy.grad_of].role != "activation" or dy in op.inputs[1:]:
        return False
    return not any(graph.storage_root(t) == dy for o in graph.ops[op.id + 1:] for t in o.inputs)


def rerun_inplace_inputs(graph: Graph) -> dict[int, int]:
    """Forward op -> the input root a re-run of it may overwrite (Plan.inplace_reruns): a relu, relu6 or add
    whose first input is an activation storage root of the same size that no other op reads (no view of it
    either), in any phase, and (add) is not also its second input. Such an input exists only to feed this op:
    once re-made for a re-run of it, its bytes are free to take the output."""
    readers: dict[int, set[int]] = {}
    for o in graph.ops:
        for t in o.inputs:
            readers.setdefault(graph.storage_root(t), set()).add(o.id)
    out: dict[int, int] = {}
    for o in graph.ops:
        if o.phase != PHASE_FORWARD or o.kind not in RERUN_INPLACE_KINDS or not o.inputs or not o.outputs:
            continue
        x = o.inputs[0]
        tx, ty = graph.tensors[x], graph.tensors[o.outputs[0]]
        if tx.alias_of is not None or tx.role != "activation" or ty.alias_of is not None or tx.bytes != ty.bytes:
            continue
        if readers.get(x) != {o.id} or (o.kind == "add" and x in o.inputs[1:]):
            continue
        out[o.id] = x
    return out


def fusion_chain(graph: Graph, op: Op) -> tuple[int, ...] | None:
    """(conv id, bn id, relu id) when conv2d (no bias) -> training batch_norm2d -> relu can run as the C
    library's fused kernel; None otherwise."""
    if op.kind != "conv2d" or op.phase != PHASE_FORWARD or op.attr("bias"):
        return None
    cons = graph.consumers()
    fwd_cons = lambda t: [c for c in cons.get(t, ()) if graph.ops[c].phase in (PHASE_FORWARD, PHASE_LOSS)]
    c1 = fwd_cons(op.outputs[0])
    if len(c1) != 1 or graph.ops[c1[0]].kind != "batch_norm2d" or not graph.ops[c1[0]].attr("training"):
        return None
    bn = graph.ops[c1[0]]
    if bn.inputs[0] != op.outputs[0] or len(bn.inputs) < 5:
        return None
    c2 = fwd_cons(bn.outputs[0])
    if len(c2) == 1 and graph.ops[c2[0]].kind == "relu":
        return (op.id, bn.id, c2[0])
    return None


def follows_forward_inplace(graph: Graph, op: Op) -> bool:
    """A batch norm backward op that must run from the output when its forward runs in place."""
    if op.forward_op is None or op.kind not in ("batch_norm2d.grad_input", "batch_norm2d.grad_weight"):
        return False
    fwd = graph.ops[op.forward_op]
    if not inplace_legal(graph, fwd):
        return False
    return op.kind == "batch_norm2d.grad_weight" or bool(fwd.attr("training"))


def variants(graph: Graph, op: Op, backend: str) -> tuple[str, ...]:
    """Legal variants of ``op`` on an accelerator with ``backend``; the first is the default; none where the
    backend cannot run it (a torch_op, PyTorch's own kernel, runs on the torch backends only)."""
    if backend == "opencl":      # its kernels (port.exec.backends.opencl), run plain or in place like torch's
        from port.exec.backends.opencl import supports
        if not supports(op.kind, dict(op.attrs)):
            return ()
        if op.kind in RERUN_INPLACE_KINDS + BACKWARD_INPLACE_KINDS and inplace_legal(graph, op):
            return ("plain", "inplace")
        return ("plain",)        # (no batch-norm-from-output kernels: its batch norms run plain)
    if backend not in TORCH_BACKENDS and not ops.has_c(op.kind, dict(op.attrs)):
        return ()        # no C kernel (a torch_op, or a record with a torch binding only): the torch engines
    if backend in TORCH_BACKENDS:
        if (op.kind in RERUN_INPLACE_KINDS + BACKWARD_INPLACE_KINDS and inplace_legal(graph, op)) \
                or follows_forward_inplace(graph, op):
            return ("plain", "inplace")
        return ("plain",)
    out: list[str] = ["plain"]
    if op.kind in CONV_KINDS:
        if is_depthwise(graph, op) or is_pointwise(graph, op):
            out.append("direct")
        if winograd_legal(graph, op):
            out.append("winograd")
        fwd = graph.ops[op.forward_op] if op.forward_op is not None else op
        h, w = graph.tensors[fwd.outputs[0]].shape[2:]
        for t in PATCH_TILES:
            if h > t:
                out.append(f"patch{t}")
        if op.kind == "conv2d" and fusion_chain(graph, op) is not None:
            out.append("fused")
    elif op.kind in ATTENTION_KINDS:
        out.append("tiled")
    else:
        if (op.kind in INPLACE_KINDS + BACKWARD_INPLACE_KINDS and inplace_legal(graph, op)) \
                or follows_forward_inplace(graph, op):
            out.append("inplace")
        if fused_into(graph, op) is not None:
            out.append("fused")
    return tuple(out)


def fused_into(graph: Graph, op: Op) -> int | None:
    """For a forward batch_norm2d/relu/relu6 that can be part of a fused chain: the conv op's id.

    Fusion covers the forward pass only: the fused kernel writes the conv output (saved for batch norm's
    backward), the statistics and the activation output; the intermediate batch-norm output is never
    materialised. Backward ops stay separate."""
    if op.phase != PHASE_FORWARD or op.kind not in ("batch_norm2d", "relu"):
        return None
    prods = graph.producers()
    cur = op
    for _ in range(2):
        p = prods.get(cur.inputs[0])
        if p is None:
            return None
        cand = graph.ops[p]
        if cand.kind == "conv2d":
            chain = fusion_chain(graph, cand)
            return cand.id if chain is not None and op.id in chain else None
        cur = cand
    return None


def patch_tile(variant: str) -> int | None:
    """T of ``patch<T>`` (the number of row bands the output is cut into, at least), else None."""
    return int(variant[5:]) if variant.startswith("patch") else None


def patch_tile_hw(variant: str, out_h: int, out_w: int) -> tuple[int, int] | None:
    """The (tile_h, tile_w) the C patch kernels run ``patch<T>`` with on an out_h x out_w output: bands of
    out_h // T whole rows (so the band's im2col is at most 1/T of the image's); None for other variants."""
    t = patch_tile(variant)
    return None if t is None else (max(1, out_h // t), out_w)


def inplace_conflicts(graph: Graph) -> tuple[tuple[int, int], ...]:
    """Pairs (a, b) of ops that must not both run ``inplace``: an in-place batch norm ``a`` saves its
    output y for its backward, so the op ``b`` that reads y may not overwrite it."""
    return graph.memo("inplace_conflicts", lambda: _inplace_conflicts(graph))


def _inplace_conflicts(graph: Graph) -> tuple[tuple[int, int], ...]:
    out = []
    cons = graph.consumers()
    for op in graph.ops:
        if op.kind == "batch_norm2d" and op.phase == PHASE_FORWARD and inplace_legal(graph, op):
            for c in cons.get(op.outputs[0], ()):
                co = graph.ops[c]
                if co.phase == PHASE_FORWARD and co.inputs[0] == op.outputs[0] and inplace_legal(graph, co):
                    out.append((op.id, co.id))
    return tuple(out)
