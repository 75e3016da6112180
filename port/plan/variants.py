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
``fused``        a chain of ops run as the C library's fused kernels, declared once in ``FUSIONS`` (the
                 chain, which members run the calls, what is never materialised, the kernels); every member
                 carries ``fused``, the others run no call of their own. Only chains the kernels compute
                 are fusable: no variant is offered that the executor cannot run.
                 * ``conv_bn_relu``: conv2d (no bias) -> training batch_norm2d -> relu, one call
                   (conv2d_bn_relu) by the conv op; the batch-norm output is never materialised.
                 * ``swiglu``: silu(a) * b (Llama's MLP): the mul runs swiglu (y from a, b), the mul's
                   input gradient runs swiglu.grad_input (da, db from dy, a, b; the silu's gradient op
                   runs none); silu(a) and its gradient are never materialised. Same bits as the plain
                   silu -> mul chain (port_swiglu_*: the silu output rounded to float first).
                 * ``se``: squeeze-excitation, x * gate(fc2(act(fc1(mean_hw(x))))) (MobileNetV3: relu,
                   hardsigmoid; EfficientNet: silu, sigmoid; RegNet-Y: relu, sigmoid): the mul runs se (y, h, z),
                   the mul's gradient op runs se.grad_weight (the fcs' gradients, dh) then se.grad_input (dx:
                   the grad_accumulate's output); the pooled mean, act(h), the gate and the inner gradients
                   (the mul's and the pool's full-size dx among them) are never stored. Not the plain chain's
                   bits (double sums, not GEMMs: within float rounding); not in the default plan, a solved
                   plan picks it where the profile says it pays.
                 * ``rmsnorm_linear``: rms_norm whose output y feeds only linears (Llama's input_layernorm -> q/k/v,
                   post_attention_layernorm -> gate/up, the final norm -> lm_head; one to three, W in one layout,
                   that fit one port-rt call: 3 + 2 per linear + 1 per bias <= 10 pointers): the norm runs
                   rmsnorm_linears (rstd and every linear's output: each block of rmslin_block_rows(rows, in) rows of x
                   normalised once into its workspace, then the k GEMMs on it), the last of their weight-gradient
                   ops rmsnorm_linears.grad_weight (every weight gradient, each block rebuilt once for all k); the
                   norm's backward is unchanged (it reads x, rstd and the linears' summed dx). y is never stored:
                   it saves y's bytes from the forward to the last weight gradient, and its write and k reads. The
                   plain chain's bits with one block (rows <= rmslin_block_rows); the weight gradient of more
                   rows sums the blocks' products (within float rounding): not in the default plan, a solved plan
                   picks it where the profile says it pays.

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
* ``fused`` conv_bn_relu on a conv2d without bias: its output feeds exactly one op, a training-mode
  batch_norm2d, whose output feeds exactly one relu, all forward.
* ``fused`` swiglu: the silu output s feeds one mul of two same-shape activations (no broadcast, no weight) and
  nothing else but that mul's gradient op, which computes both operands' gradients; its ds feeds only the
  silu's gradient op (no backward at all: the forward pair only).
* ``fused`` se: each intermediate (pooled, h, act(h), z, gate) read only by the next member and the chain's
  gradient ops, fcs 1x1 convs with bias; x read by the pool and the mul alone; in training every member's
  gradient op present (the fcs' weights and biases trained) and one grad_accumulate of the mul's and the pool's dx.
* ``fused`` rmsnorm_linear: the norm's output y (no view of it, no graph input or output) read only by forward
  linears as their x (one or more) and by those linears' weight-gradient ops, each computing the weight's gradient.
* in-place batch norm needs affine weight and bias (it rebuilds x-hat from the output).
* ``inplace`` on an element-wise input gradient (BACKWARD_INPLACE_KINDS): dy is an activation gradient on its
  own root, as large as dx, read by no later op and not the op's other input.
* ``patch<T>`` on conv2d ops whose output has more than T rows.
* a re-run (not a variant: Plan.inplace_reruns) of relu, relu6 or add may write over its first input when
  ``rerun_inplace_inputs`` names it (read by that op alone); port.plan.semantics says when.
* ``winograd`` where the C library runs it (``winograd_legal`` asks port_conv2d_resolve_algo).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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
    if op.kind == "batch_norm2d" and (len(op.inputs) < 3 or op.attr("gamma_has_zero") or
                                      any(graph.tensors[t].role != "parameter" for t in op.inputs[1:3])):
        return False        # in place, the backward rebuilds x-hat from y: (y - beta) / gamma needs gamma != 0
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
    once re-made for a re-run of it, its bytes are free to take the output. Once per graph (every schedule asks);
    the caller's own copy."""
    return dict(graph.memo("rerun_inplace_inputs", lambda: _rerun_inplace_inputs(graph)))


def _rerun_inplace_inputs(graph: Graph) -> dict[int, int]:
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


def _conv_bn_relu(graph: Graph, op: Op) -> tuple[int, ...] | None:
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


def _swiglu(graph: Graph, op: Op) -> tuple[int, ...] | None:
    """(silu, mul[, mul.grad_input, silu.grad_input]) when silu(a) * b can run as the C library's SwiGLU kernels:
    the silu output s feeds one forward mul of two same-shape activations (no broadcast, no weight) and nothing
    else but that mul's gradient; in a training graph the mul's one input-gradient op computes both operands'
    gradients and its ds feeds only the silu's input gradient (no backward at all: the forward pair)."""
    if op.kind != "silu" or op.phase != PHASE_FORWARD or len(op.inputs) != 1 or len(op.outputs) != 1:
        return None
    T, a, s = graph.tensors, op.inputs[0], op.outputs[0]
    if any(t.alias_of == s for t in T) or T[s].alias_of is not None:
        return None
    cons = graph.consumers()
    fwd = [c for c in cons.get(s, ()) if graph.ops[c].phase in (PHASE_FORWARD, PHASE_LOSS)]
    if len(fwd) != 1:
        return None
    m = graph.ops[fwd[0]]
    if m.kind != "mul" or len(m.inputs) != 2 or m.attrs or len(m.outputs) != 1 or m.inputs[0] == m.inputs[1]:
        return None
    b = m.inputs[1] if m.inputs[0] == s else m.inputs[0]
    if not (T[a].shape == T[b].shape == T[s].shape == T[m.outputs[0]].shape) \
            or T[b].role != "activation" or T[a].role != "activation":
        return None
    bwd_m = [o for o in graph.ops if o.forward_op == m.id]
    bwd_s = [o for o in graph.ops if o.forward_op == op.id]
    if not bwd_m and not bwd_s and all(c == m.id for c in cons.get(s, ())):
        return (op.id, m.id)
    if len(bwd_m) != 1 or len(bwd_s) != 1:
        return None
    g, sg = bwd_m[0], bwd_s[0]
    if g.kind != "mul.grad_input" or g.attr("grads") != (0, 1) or g.attr("reads") != (0, 1) \
            or tuple(g.inputs[1:]) != tuple(m.inputs) or len(g.outputs) != 2:
        return None
    ds = g.outputs[m.inputs.index(s)]
    if set(cons.get(s, ())) != {m.id, g.id} or sg.kind != "silu.grad_input" or tuple(sg.inputs) != (ds, a) \
            or tuple(cons.get(ds, ())) != (sg.id,) or any(t.alias_of == ds for t in T) \
            or T[ds].alias_of is not None or T[sg.outputs[0]].alias_of is not None or not g.id < sg.id:
        return None
    return (op.id, m.id, g.id, sg.id)


def _swiglu_calls(graph: Graph, ch: "Chain", op: Op) -> list:
    """The mul runs swiglu (y from a, b); the mul's input gradient runs swiglu.grad_input (da, db from dy, a, b)."""
    silu, m = graph.ops[ch.ops[0]], graph.ops[ch.ops[1]]
    a, s = silu.inputs[0], silu.outputs[0]
    b = m.inputs[1] if m.inputs[0] == s else m.inputs[0]
    if op.id == m.id:
        return [("swiglu", (m.outputs[0],), (a, b), {}, (silu.id,))]
    g, sg = graph.ops[ch.ops[2]], graph.ops[ch.ops[3]]
    db = g.outputs[m.inputs.index(b)]
    return [("swiglu.grad_input", (sg.outputs[0], db), (g.inputs[0], a, b), {}, (sg.id,))]


def _swiglu_nonmat(graph: Graph, ch: tuple[int, ...]) -> tuple[int, ...]:
    """s = silu(a) and, in training, its gradient ds: the fused calls read a and b instead."""
    s = graph.ops[ch[0]].outputs[0]
    if len(ch) == 2:
        return (s,)
    m, g = graph.ops[ch[1]], graph.ops[ch[2]]
    return (s, g.outputs[m.inputs.index(s)])


def _backward_ops(graph: Graph) -> dict[int, tuple[int, ...]]:
    """forward op id -> the ids of its backward ops (``Op.forward_op``), in program order."""
    def build() -> dict[int, tuple[int, ...]]:
        out: dict[int, list[int]] = {}
        for o in graph.ops:
            if o.forward_op is not None:
                out.setdefault(o.forward_op, []).append(o.id)
        return {k: tuple(v) for k, v in out.items()}
    return graph.memo("backward_ops", build)


def _rotary_forward(graph: Graph, op: Op) -> tuple[Op, ...] | None:
    """(mul1, narrow lo, narrow hi, neg, cat, mul2, add) of y = x cos + cat(-x[..., h:], x[..., :h]) sin, the
    chain starting at mul1 = x * cos; None where the ops differ from that (x read elsewhere, a view of an
    intermediate, other dims or a table of another shape)."""
    if op.kind != "mul" or op.phase != PHASE_FORWARD or op.attrs or len(op.inputs) != 2 or len(op.outputs) != 1:
        return None
    T = graph.tensors
    x, c = op.inputs
    sx, sc = tuple(T[x].shape), tuple(T[c].shape)
    if len(sx) != 4 or sx[3] % 2 or len(sc) != 4 or sc[0] not in (1, sx[0]) or sc[1:] != (1,) + sx[2:] or x == c:
        return None
    h = sx[3] // 2
    cons = graph.consumers()
    fwd = lambda t: [graph.ops[i] for i in cons.get(t, ())                               # noqa: E731
                     if graph.ops[i].phase in (PHASE_FORWARD, PHASE_LOSS)]
    xs = fwd(x)
    if len(xs) != 3 or xs[0].id != op.id:
        return None
    halves = {}
    for o in xs[1:]:
        if o.kind != "narrow" or o.attr("dim") not in (3, -1) or o.attr("length") != h or o.attr("squeeze") \
                or len(o.outputs) != 1:
            return None
        halves[o.attr("start")] = o
    if set(halves) != {0, h}:
        return None
    lo, hi = halves[0], halves[h]
    one = lambda t, kind: (lambda c_: c_[0] if len(c_) == 1 and c_[0].kind == kind else None)(fwd(t))  # noqa: E731
    neg = one(hi.outputs[0], "neg")
    cat = one(neg.outputs[0], "cat") if neg is not None else None
    if cat is None or tuple(cat.inputs) != (neg.outputs[0], lo.outputs[0]) or cat.attr("dim") not in (3, -1) \
            or one(lo.outputs[0], "cat") is not cat:
        return None
    m2 = one(cat.outputs[0], "mul")
    if m2 is None or m2.attrs or len(m2.inputs) != 2 or len(m2.outputs) != 1:
        return None
    s = m2.inputs[1] if m2.inputs[0] == cat.outputs[0] else m2.inputs[0]
    if s == cat.outputs[0] or tuple(T[s].shape) != sc:
        return None
    add = one(op.outputs[0], "add")
    if add is None or one(m2.outputs[0], "add") is not add or sorted(add.inputs) != sorted((op.outputs[0],
                                                                                            m2.outputs[0])):
        return None
    chain = (op, lo, hi, neg, cat, m2, add)
    inner = {t for o in chain[:-1] for t in o.outputs}
    if any(T[t].alias_of is not None for t in inner) or any(t.alias_of in inner or t.alias_of == x for t in T):
        return None
    return chain


def _rotary(graph: Graph, op: Op) -> tuple[int, ...] | None:
    """The member op ids (program order) of a rotary embedding the C kernels compute: the seven forward ops
    (_rotary_forward) and, in training, their backward ops -- add.grad_input, the gradients of both products
    (x's and the rotated half's only: the tables take none), cat.grad_input, neg.grad_input, both
    narrow.grad_input and the two grad_accumulate that sum x's three gradients -- where x's gradient has no other
    part and the intermediate gradients are read by nothing else."""
    fw = _rotary_forward(graph, op)
    if fw is None:
        return None
    T, bw_of = graph.tensors, _backward_ops(graph)
    m1, lo, hi, neg, cat, m2, add = fw
    fids = tuple(o.id for o in fw)
    bws = [bw_of.get(i, ()) for i in fids]
    cons = graph.consumers()
    if not any(bws):
        inner = [t for o in fw[:-1] for t in o.outputs]
        if any(set(cons.get(t, ())) - set(fids) for t in inner + [m1.inputs[0]]):
            return None
        return tuple(sorted(fids))
    if any(len(b) != 1 for b in bws):
        return None
    g = {o.id: graph.ops[b[0]] for o, b in zip(fw, bws)}
    ga, g2, gc, gn, gl, gh, g1 = g[add.id], g[m2.id], g[cat.id], g[neg.id], g[lo.id], g[hi.id], g[m1.id]
    x = m1.inputs[0]
    kinds = (ga.kind, g2.kind, gc.kind, gn.kind, gl.kind, gh.kind, g1.kind)
    if kinds != ("add.grad_input", "mul.grad_input", "cat.grad_input", "neg.grad_input", "narrow.grad_input",
                 "narrow.grad_input", "mul.grad_input") or len(ga.outputs) != 2:
        return None
    of = {T[t].grad_of: t for t in ga.outputs}
    ci = m2.inputs.index(cat.outputs[0])
    if set(of) != {m1.outputs[0], m2.outputs[0]} \
            or g1.attr("grads") != (0,) or g1.attr("reads") != (1,) or tuple(g1.inputs) != (of[m1.outputs[0]],
                                                                                               m1.inputs[1]) \
            or g2.attr("grads") != (ci,) or g2.attr("reads") != (1 - ci,) \
            or tuple(g2.inputs) != (of[m2.outputs[0]], m2.inputs[1 - ci]) \
            or gc.attr("grads") != (0, 1) or tuple(gc.inputs) != (g2.outputs[0],) \
            or tuple(gn.inputs) != (gc.outputs[0],) or tuple(gh.inputs) != (gn.outputs[0],) \
            or tuple(gl.inputs) != (gc.outputs[1],):
        return None
    parts = {gl.outputs[0], gh.outputs[0], g1.outputs[0]}
    accs = [o for t in parts for o in (graph.ops[i] for i in cons.get(t, ())) if o.kind == "grad_accumulate"]
    accs = list({o.id: o for o in accs}.values())
    if len(accs) == 1:      # the first sums two parts; the second the first's sum and the third part
        nxt = [graph.ops[i] for i in cons.get(accs[0].outputs[0], ())]
        accs += [o for o in nxt if o.kind == "grad_accumulate"]
    if len(accs) != 2:
        return None
    a1, a2 = sorted(accs, key=lambda o: o.id)
    if a1.outputs[0] not in a2.inputs or set(a1.inputs) | set(a2.inputs) != parts | {a1.outputs[0]} \
            or T[a2.outputs[0]].grad_of != x:
        return None
    bids = tuple(o.id for o in (ga, g2, gc, gn, gl, gh, g1, a1, a2))
    members = set(fids) | set(bids)
    inner = [t for o in fw[:-1] for t in o.outputs] + [m1.inputs[0]] \
        + [t for o in (ga, g2, gc, gn, gl, gh, g1, a1) for t in o.outputs]
    if any(set(cons.get(t, ())) - members for t in inner) \
            or any(T[t].alias_of is not None for o in (g2, gc, gn, gl, gh, g1, a1, a2) for t in o.outputs) \
            or max(fids) > min(bids) or a2.id != max(bids):
        return None
    return tuple(sorted(fids)) + tuple(sorted(bids))


def _rotary_calls(graph: Graph, ch: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """The add (the last forward member) runs the forward call; x's last gradient sum the backward one."""
    return {ch[6]: ch[:6]} | ({ch[-1]: ch[7:-1]} if len(ch) > 7 else {})


def _rotary_nonmat(graph: Graph, ch: tuple[int, ...]) -> tuple[int, ...]:
    """Every intermediate: the products, halves, rotation and, in training, every partial gradient (the add's
    input gradients are views of dy and stay)."""
    fw = [t for i in ch[:6] for t in graph.ops[i].outputs]
    bw = [t for i in ch[7:-1] if graph.ops[i].kind != "add.grad_input" for t in graph.ops[i].outputs]
    return tuple(fw + bw)


def _rotary_inplace(graph: Graph, ch: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """The forward call writes y over x (port_rotary_forward reads each pair before writing it) where x owns its
    bytes, is an activation of y's size and nothing but the chain reads it (_rotary: x dies at the call, which
    reads it in every plan: fused_reads)."""
    T, m1, add = graph.tensors, graph.ops[ch[0]], graph.ops[ch[6]]
    x, y = m1.inputs[0], add.outputs[0]
    if T[x].alias_of is not None or graph.storage_root(x) != x or T[x].role != "activation" \
            or T[x].bytes != T[y].bytes or T[y].alias_of is not None or x in (graph.input_id, graph.logits_id):
        return ()
    return ((add.id, y, x),)


def _rotary_emit(graph: Graph, ch: "Chain", op: Op) -> list:
    """rotary: y from (x, cos, sin); rotary.grad_input: dx from (dy, cos, sin)."""
    fw = _rotary_forward(graph, graph.ops[ch.ops[0]])
    m1, m2, add = fw[0], fw[5], fw[6]
    x, c = m1.inputs
    s = m2.inputs[1] if m2.inputs[0] == fw[4].outputs[0] else m2.inputs[0]
    if op.id == add.id:
        return [("rotary", (add.outputs[0],), (x, c, s), {}, ch.ops[:6])]
    dy = next(graph.ops[i] for i in ch.ops[7:] if graph.ops[i].kind == "add.grad_input").inputs[0]
    return [("rotary.grad_input", (op.outputs[0],), (dy, c, s), {}, ch.ops[7:-1])]


SE_ACT_KINDS, SE_GATE_KINDS = ("relu", "silu"), ("sigmoid", "hardsigmoid")   # the pairs port_se_* computes


def _se_fc(o: Op | None) -> bool:
    """A squeeze-excitation fc: a forward 1x1 conv2d with bias, stride 1, no padding, one group."""
    return o is not None and o.kind == "conv2d" and o.phase == PHASE_FORWARD and bool(o.attr("bias")) \
        and len(o.inputs) == 3 and tuple(o.attr("kernel")) == (1, 1) and tuple(o.attr("stride")) == (1, 1) \
        and tuple(o.attr("padding")) == (0, 0) and o.attr("groups") == 1


def _se(graph: Graph, op: Op) -> tuple[int, ...] | None:
    """The member ids (program order) of a squeeze-excitation chain x -> global_avg_pool2d -> conv 1x1 (fc1, bias)
    -> relu|silu -> conv 1x1 (fc2, bias) -> sigmoid|hardsigmoid -> mul with x (torchvision's SqueezeExcitation,
    timm's SE modules): each intermediate read by the next member only (and by the chain's gradient ops), no view
    of any. In a training graph also every member's gradient op: mul.grad_input (both operands), the gate's, fc2's
    grad_input and grad_weight (weight and bias), the activation's, fc1's, the pool's, and the one grad_accumulate
    summing the mul's and the pool's dx (x read by the pool and the mul alone); None otherwise."""
    if op.kind != "global_avg_pool2d" or op.phase != PHASE_FORWARD:
        return None
    T, cons = graph.tensors, graph.consumers()
    x, p = op.inputs[0], op.outputs[0]

    def nxt(t: int, kinds: tuple[str, ...]) -> Op | None:   # the one forward reader of t, reading it as input 0
        c = [i for i in cons.get(t, ()) if graph.ops[i].phase in (PHASE_FORWARD, PHASE_LOSS)]
        o = graph.ops[c[0]] if len(c) == 1 else None
        return o if o is not None and o.kind in kinds and o.inputs[0] == t and len(o.outputs) == 1 else None
    fc1 = nxt(p, ("conv2d",))
    act = nxt(fc1.outputs[0], SE_ACT_KINDS) if _se_fc(fc1) else None
    fc2 = nxt(act.outputs[0], ("conv2d",)) if act is not None else None
    gate = nxt(fc2.outputs[0], SE_GATE_KINDS) if _se_fc(fc2) else None
    if gate is None:
        return None
    g = gate.outputs[0]
    m = [graph.ops[i] for i in cons.get(g, ()) if graph.ops[i].phase in (PHASE_FORWARD, PHASE_LOSS)]
    if len(m) != 1 or m[0].kind != "mul" or m[0].attrs or len(m[0].inputs) != 2 or set(m[0].inputs) != {g, x} \
            or len(T[x].shape) != 4 or T[m[0].outputs[0]].shape != T[x].shape or T[x].role != "activation":
        return None
    m = m[0]
    inter = (p, fc1.outputs[0], act.outputs[0], fc2.outputs[0], g)
    if any(T[t].alias_of is not None for t in inter) or any(t.alias_of in inter for t in T):
        return None
    fwd_ids = (op.id, fc1.id, act.id, fc2.id, gate.id, m.id)
    bwd = {f: [o for o in graph.ops if o.forward_op == f] for f in fwd_ids}
    if not any(bwd.values()):
        members = fwd_ids
    else:
        members = _se_backward(graph, x, m, gate, act, fc1, fc2, op, bwd)
        if members is None:
            return None
        members = tuple(sorted(fwd_ids + members))
    if any(not set(cons.get(t, ())) <= set(members) for t in inter):
        return None
    return members


def _se_backward(graph, x, m, gate, act, fc1, fc2, pool, bwd) -> tuple[int, ...] | None:
    """The gradient ops of an SE chain (see _se), or None where they are not the ones port_se_backward_* computes:
    each gradient intermediate read by the next gradient op only, the mul's gradient op first."""
    T, cons = graph.tensors, graph.consumers()

    def single(f: Op, kind: str) -> Op | None:
        o = bwd[f.id]
        return o[0] if len(o) == 1 and o[0].kind == kind else None

    def fc_pair(f: Op) -> tuple[Op, Op] | None:
        o = sorted(bwd[f.id], key=lambda q: q.kind)
        if [q.kind for q in o] != ["conv2d.grad_input", "conv2d.grad_weight"] \
                or tuple(o[1].attr("grads") or ()) != ("weight", "bias") or o[0].inputs[0] != o[1].inputs[0]:
            return None
        return o[0], o[1]
    mg, gg, ag = single(m, "mul.grad_input"), single(gate, f"{gate.kind}.grad_input"), single(act, f"{act.kind}.grad_input")
    pg, f2, f1 = single(pool, "global_avg_pool2d.grad_input"), fc_pair(fc2), fc_pair(fc1)
    if None in (mg, gg, ag, pg, f2, f1) or mg.attr("grads") != (0, 1) or mg.attr("reads") != (0, 1) \
            or tuple(mg.inputs[1:]) != tuple(m.inputs) or len(mg.outputs) != 2:
        return None
    g = gate.outputs[0]
    dg, dxm = mg.outputs[m.inputs.index(g)], mg.outputs[m.inputs.index(x)]
    steps = ((dg, (gg,)), (gg.outputs[0], f2), (f2[0].outputs[0], (ag,)), (ag.outputs[0], f1),
             (f1[0].outputs[0], (pg,)))
    if any(o.inputs[0] != t or set(cons.get(t, ())) != {q.id for q in ops_} for t, ops_ in steps for o in ops_):
        return None
    dxp = pg.outputs[0]
    acc = cons.get(dxm, ())
    if len(acc) != 1 or tuple(cons.get(dxp, ())) != tuple(acc):
        return None
    acc = graph.ops[acc[0]]
    if acc.kind != "grad_accumulate" or tuple(acc.inputs) != (dxm, dxp) or len(acc.outputs) != 1:
        return None
    grads = (dg, dxm, dxp) + tuple(t for t, _ in steps[1:])
    if any(T[t].alias_of is not None for t in grads) or any(t.alias_of in grads for t in T):
        return None
    ids = (mg.id, gg.id, *(o.id for o in f2), ag.id, *(o.id for o in f1), pg.id, acc.id)
    return ids if mg.id == min(ids) else None


def _se_parts(graph: Graph, ch: tuple[int, ...]) -> dict:
    """The named members and tensors of an SE chain (see _se)."""
    O = graph.ops
    pool, fc1, act, fc2, gate, m = (O[i] for i in ch if O[i].phase == PHASE_FORWARD)
    x = pool.inputs[0]
    out = dict(pool=pool, fc1=fc1, act=act, fc2=fc2, gate=gate, mul=m, x=x, h=fc1.outputs[0], z=fc2.outputs[0],
               attrs={"act": act.kind, "gate": gate.kind})
    bwd = [O[i] for i in ch if O[i].phase != PHASE_FORWARD]
    if bwd:
        by = {(o.forward_op, o.kind): o for o in bwd}
        mg = by[(m.id, "mul.grad_input")]
        out.update(mg=mg, dy=mg.inputs[0], dh=by[(act.id, f"{act.kind}.grad_input")].outputs[0],
                   fc1gw=by[(fc1.id, "conv2d.grad_weight")], fc2gw=by[(fc2.id, "conv2d.grad_weight")],
                   acc=next(o for o in bwd if o.kind == "grad_accumulate"))
    return out


def _se_calls(graph: Graph, ch: "Chain", op: Op) -> list:
    """The mul runs se (y, h, z from x and the fcs' weights and biases); the mul's gradient op runs se.grad_weight
    (the fcs' gradients and dh from dy, x, w2, h, z) then se.grad_input (dx, the grad_accumulate's output, from
    dy, z, w1, dh)."""
    P = _se_parts(graph, ch.ops)
    fc1, fc2, a = P["fc1"], P["fc2"], P["attrs"]
    w1, b1, w2, b2 = fc1.inputs[1], fc1.inputs[2], fc2.inputs[1], fc2.inputs[2]
    fwd_cover = tuple(P[k].id for k in ("pool", "fc1", "act", "fc2", "gate"))
    if op.id == P["mul"].id:
        return [("se", (op.outputs[0], P["h"], P["z"]), (P["x"], w1, b1, w2, b2), a, fwd_cover)]
    rest = tuple(i for i in ch.ops if graph.ops[i].phase != PHASE_FORWARD and i != op.id)
    dws = P["fc1gw"].outputs + P["fc2gw"].outputs
    return [("se.grad_weight", dws + (P["dh"],), (P["dy"], P["x"], w2, P["h"], P["z"]), a, rest),
            ("se.grad_input", P["acc"].outputs, (P["dy"], P["z"], w1, P["dh"]), a, ())]


def _se_nonmat(graph: Graph, ch: tuple[int, ...]) -> tuple[int, ...]:
    """The pooled mean, act(h) and the gate and, in training, every gradient inside the chain but dh (the two
    backward calls' hand-off) and the fcs' parameter gradients: the mul's two, the gate's, fc2's input gradient,
    fc1's input gradient and the pool's dx (the full-size dx of the mul and of the pool: only their sum is stored)."""
    P = _se_parts(graph, ch)
    out = [P["pool"].outputs[0], P["act"].outputs[0], P["gate"].outputs[0]]
    if "mg" in P:
        O = graph.ops
        for i in ch:
            o = O[i]
            if o.phase != PHASE_FORWARD and o.kind not in ("conv2d.grad_weight", "grad_accumulate") \
                    and o.outputs[0] != P["dh"]:
                out.extend(o.outputs)
    return tuple(out)


# the rows of x an rmsnorm_linears call normalises at a time (its workspace: that many rows of x): at least 256 rows
# and 256 KiB of them (GEMMs large enough to run well; a block that small stays in the cache, and one block is the
# plain chain's bits), at most 4 blocks (few GEMMs and barriers: at most a quarter of y in the workspace, none stored)
RMSLIN_MIN_BLOCK_ROWS, RMSLIN_MIN_BLOCK_FLOATS, RMSLIN_MAX_BLOCKS = 256, 65536, 4


def rmslin_block_rows(rows: int, features: int) -> int:
    return max(RMSLIN_MIN_BLOCK_ROWS, RMSLIN_MIN_BLOCK_FLOATS // max(1, features), -(-rows // RMSLIN_MAX_BLOCKS))


def _rmsnorm_linear(graph: Graph, op: Op) -> tuple[int, ...] | None:
    """(norm, linears..., their weight-gradient ops...) in program order when rms_norm's output y is read only by
    forward linears (as their input x; one to three, all with W in one layout, that one rmsnorm_linears call takes:
    Llama's q/k/v, gate/up or lm_head) and, in training, by those linears' weight-gradient ops (each computing the
    weight's gradient): no view of y, y no graph input or output.
    The norm's own gradient ops read x, rstd and the linears' summed input gradient, not y: not members."""
    from port.ops.linear import rmslin_fits
    if op.kind != "rms_norm" or op.phase != PHASE_FORWARD or len(op.outputs) != 2:
        return None
    T, y = graph.tensors, op.outputs[0]
    if T[y].alias_of is not None or any(t.alias_of == y for t in T) or y in (graph.loss_id, graph.logits_id) \
            or y in graph.input_ids or T[y].role != "activation":
        return None
    readers = [graph.ops[i] for i in graph.consumers().get(y, ())]
    lins = [o for o in readers if o.kind == "linear" and o.phase == PHASE_FORWARD]
    if not lins or any(o.inputs[0] != y or y in o.inputs[1:] or len(o.outputs) != 1 for o in lins):
        return None
    if len({bool(o.attr("weight_t")) for o in lins}) != 1 or not rmslin_fits(tuple(bool(o.attr("bias"))
                                                                                   for o in lins)):
        return None
    ids = {o.id for o in lins}
    gws = [o for o in readers if o.id not in ids]
    if any(o.kind != "linear.grad_weight" or o.forward_op not in ids or tuple(o.inputs[1:]) != (y,)
           or "weight" not in (o.attr("grads") or ()) for o in gws):
        return None
    if len({o.forward_op for o in gws}) != len(gws) or not rmslin_fits(tuple("bias" in o.attr("grads") for o in gws)
                                                                       or (False,)):
        return None
    return (op.id,) + tuple(sorted(ids)) + tuple(sorted(o.id for o in gws))


def _rmsnorm_linear_parts(graph: Graph, ch: tuple[int, ...]) -> tuple[list[Op], list[Op]]:
    """The chain's linears and weight-gradient ops (program order)."""
    members = [graph.ops[i] for i in ch[1:]]
    return [o for o in members if o.phase == PHASE_FORWARD], [o for o in members if o.phase != PHASE_FORWARD]


def _rmsnorm_linear_covers(graph: Graph, ch: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """The norm's call computes every linear; the last weight-gradient op's call every weight gradient."""
    lins, gws = _rmsnorm_linear_parts(graph, ch)
    return {ch[0]: tuple(o.id for o in lins)} | ({gws[-1].id: tuple(o.id for o in gws[:-1])} if gws else {})


def _rmsnorm_linear_calls(graph: Graph, ch: "Chain", op: Op) -> list:
    """The norm runs rmsnorm_linears (rstd and every linear's output from x, the norm's weight and the linears'
    weights and biases, each block of rows of x normalised once); the last weight-gradient op runs
    rmsnorm_linears.grad_weight (every linear's gradients from their dy, x, rstd and the norm's weight)."""
    norm = graph.ops[ch.ops[0]]
    lins, gws = _rmsnorm_linear_parts(graph, ch.ops)
    x, rstd, gamma = norm.inputs[0], norm.outputs[1], tuple(norm.inputs[1:2])
    d = graph.tensors[x].shape[-1]
    a = {"gamma": bool(gamma), "weight_t": bool(lins[0].attr("weight_t")),
         "block_rows": rmslin_block_rows(graph.tensors[x].numel // d, d)}
    if op.id == norm.id:
        bias = tuple(bool(o.attr("bias")) for o in lins)
        ins = (x,) + gamma + tuple(o.inputs[1] for o in lins) + tuple(o.inputs[2] for o in lins if o.attr("bias"))
        outs = (rstd,) + tuple(o.outputs[0] for o in lins)
        return [("rmsnorm_linears", outs, ins, a | {"eps": norm.attr("eps"), "biases": bias},
                 tuple(o.id for o in lins))]
    grads_ = [dict(zip(o.attr("grads"), o.outputs)) for o in gws]
    outs = tuple(g["weight"] for g in grads_) + tuple(g["bias"] for g in grads_ if "bias" in g)
    ins = tuple(o.inputs[0] for o in gws) + (x, rstd) + gamma
    return [("rmsnorm_linears.grad_weight", outs, ins, a | {"biases": tuple("bias" in g for g in grads_)},
             tuple(o.id for o in gws[:-1]))]


@dataclass(frozen=True)
class Fusion:
    """One fused kernel the planner may choose, declared once: what chain of ops it replaces (``find``: the
    member op ids, in program order, of the chain that starts at an op, where the fused kernel computes it;
    None elsewhere: the legality), which members run the fused calls and which members each covers
    (``calls``: call member -> the members it computes besides itself), which tensors the fused calls never
    materialise (``nonmat``), and the kernels it runs (``kernels``, on the C backend). Every member of a chain
    carries variant ``fused``; a member that runs no call runs nothing (its results come from its call op).
    variants(), fused_into(), the ILP, the simulator, the profiler and lowering all read this table."""
    name: str
    kinds: tuple[str, ...]                                   # the members' op kinds, in program order
    kernels: tuple[str, ...]                                 # the calls' kernel kinds (port.ops records)
    find: Callable[[Graph, Op], tuple[int, ...] | None]      # the chain starting at op, else None
    calls: Callable[[Graph, tuple[int, ...]], dict[int, tuple[int, ...]]]    # call op -> members it covers
    nonmat: Callable[[Graph, tuple[int, ...]], tuple[int, ...]]       # tensors never materialised
    # the calls a call op runs: [(kernel, outputs, inputs, attrs, covered op ids)] (port.exec.registry.CallSpec)
    emit: Callable[[Graph, "Chain", Op], list]
    # (call op, output, input): a call's output written over the bytes of an input that dies at it (in place)
    inplace: Callable[[Graph, tuple[int, ...]], tuple[tuple[int, int, int], ...]] = lambda g, ch: ()
    # whether the default plan (port.lower.lower.default_plan) fuses it; else only a solved plan picks it where the
    # profile says it pays
    default: bool = True
    # the roofline model's factor on each call op's plain bound (port.cost.roofline): a fused chain moves fewer bytes
    modeled_factor: float = 0.8


@dataclass(frozen=True)
class Chain:
    """One fusable chain of a graph: its Fusion, its member op ids (program order; ops[0] is its key), the
    call op computing each member (``at``, aligned with ops), the tensors never materialised when fused and the
    call outputs written in place over an input when fused."""
    fusion: Fusion
    ops: tuple[int, ...]
    at: tuple[int, ...]
    nonmat: tuple[int, ...]
    inplace: tuple[tuple[int, int, int], ...] = ()      # (call op, output, input it overwrites) when fused

    @property
    def calls(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.at))

    def call_of(self, op_id: int) -> int:
        return self.at[self.ops.index(op_id)]


FUSIONS: tuple[Fusion, ...] = (
    Fusion("conv_bn_relu", ("conv2d", "batch_norm2d", "relu"), ("conv2d_bn_relu",), _conv_bn_relu,
           calls=lambda g, ch: {ch[0]: ch[1:]},
           nonmat=lambda g, ch: (g.storage_root(g.ops[ch[1]].outputs[0]),),   # the batch-norm output
           emit=lambda g, ch, op: ops.record("conv2d").calls(g, op, "fused")),
    Fusion("swiglu", ("silu", "mul", "mul.grad_input", "silu.grad_input"), ("swiglu", "swiglu.grad_input"),
           _swiglu, calls=lambda g, ch: {ch[1]: (ch[0],)} | ({ch[2]: (ch[3],)} if len(ch) > 2 else {}),
           nonmat=_swiglu_nonmat, emit=_swiglu_calls),
    Fusion("rotary", ("mul", "narrow", "narrow", "neg", "cat", "mul", "add", "add.grad_input", "mul.grad_input",
                      "cat.grad_input", "neg.grad_input", "narrow.grad_input", "narrow.grad_input", "mul.grad_input",
                      "grad_accumulate", "grad_accumulate"),
           ("rotary", "rotary.grad_input"), _rotary, calls=_rotary_calls, nonmat=_rotary_nonmat, emit=_rotary_emit,
           inplace=_rotary_inplace),
    Fusion("se", ("global_avg_pool2d", "conv2d", "relu|silu", "conv2d", "sigmoid|hardsigmoid", "mul"),
           ("se", "se.grad_weight", "se.grad_input"), _se,
           calls=lambda g, ch: {ch[5]: ch[:5]} | ({ch[6]: ch[7:]} if len(ch) > 6 else {}),
           nonmat=_se_nonmat, emit=_se_calls, default=False),
    Fusion("rmsnorm_linear", ("rms_norm", "linear", "linear.grad_weight"),
           ("rmsnorm_linears", "rmsnorm_linears.grad_weight"), _rmsnorm_linear,
           calls=_rmsnorm_linear_covers, nonmat=lambda g, ch: (g.ops[ch[0]].outputs[0],),
           emit=_rmsnorm_linear_calls, default=False),
)
FUSED_KERNELS = tuple(k for f in FUSIONS for k in f.kernels)


def _make_chain(graph: Graph, f: Fusion, ops_: tuple[int, ...]) -> Chain:
    at = {m: m for m in ops_}
    for c, covered in f.calls(graph, ops_).items():
        for m in covered:
            at[m] = c
    return Chain(f, ops_, tuple(at[m] for m in ops_), tuple(f.nonmat(graph, ops_)), tuple(f.inplace(graph, ops_)))


def _find_chain(graph: Graph, op: Op) -> Chain | None:
    for f in FUSIONS:
        if op.kind == f.kinds[0]:
            ch = f.find(graph, op)
            if ch is not None:
                return _make_chain(graph, f, ch)
    return None


def chains(graph: Graph) -> dict[int, Chain]:
    """Every fusable chain of ``graph``, by its key (first member) op id."""
    def build() -> dict[int, Chain]:
        out: dict[int, Chain] = {}
        for o in graph.ops:
            ch = _find_chain(graph, o)
            if ch is not None:
                out[o.id] = ch
        return out
    return graph.memo("fusion_chains", build)


def chain_of(graph: Graph, op: Op) -> Chain | None:
    """The fusable chain ``op`` is a member of (any member, not only its key), else None."""
    def build() -> dict[int, Chain]:
        return {m: ch for ch in chains(graph).values() for m in ch.ops}
    if not graph.owns(op):
        return _find_chain(graph, op)
    return graph.memo("fusion_members", build).get(op.id)


def fusion_chain(graph: Graph, op: Op) -> tuple[int, ...] | None:
    """The member op ids of the fusable chain whose key (first member) is ``op`` (for conv -> bn -> relu:
    (conv id, bn id, relu id)); None otherwise."""
    if not graph.owns(op):
        ch = _find_chain(graph, op)
    else:
        ch = chains(graph).get(op.id)
    return ch.ops if ch is not None else None


def runs_fused_call(graph: Graph, op: Op) -> bool:
    """Whether ``op``, run ``fused``, runs its chain's fused call(s) (else it runs nothing: another member's
    call computes it)."""
    ch = chain_of(graph, op)
    return ch is not None and ch.call_of(op.id) == op.id


def fused_share(graph: Graph, op: Op) -> float:
    """The part of its chain's call that a member run ``fused`` is priced at: its FLOPs (vector FLOPs, else one)
    over those of every member the same call computes. Profiles key costs by signature, and identical layers may
    play different parts in a chain (Llama's gate and up projections: one weight gradient's call computes both;
    its three norms head chains of 3, 2 and 1 linears): each member books its share of the call, so members of one
    signature book alike and a chain's members add up to its calls. 1.0 for an op in no chain."""
    ch = chain_of(graph, op)
    if ch is None:
        return 1.0

    def w(i: int) -> float:
        o = graph.ops[i]
        return float(o.flops + o.vector_flops) or 1.0
    c = ch.call_of(op.id)
    return w(op.id) / sum(w(m) for m in ch.ops if ch.call_of(m) == c)


def fused_inplace(graph: Graph) -> dict[int, tuple[int, int]]:
    """Call op -> (input, output): the fused call writes that output over that input's bytes (when its chain runs
    fused; the key op's ``fused`` variant decides)."""
    return graph.memo("fused_inplace", lambda: {c: (x, y) for ch in chains(graph).values() for c, y, x in ch.inplace})


def fused_reads(graph: Graph) -> dict[int, tuple[int, ...]]:
    """Call op -> the activation or gradient tensors it reads as a fused call beyond its own inputs (the
    inputs of the members it covers and of its calls, less the chain's never-materialised tensors and its own
    outputs).
    Liveness counts these reads whether or not the chain is fused (port.plan.semantics.readers_by_root),
    so that a plan may switch a chain to fused without moving any tensor's death earlier."""
    def build() -> dict[int, tuple[int, ...]]:
        out: dict[int, tuple[int, ...]] = {}
        for ch in chains(graph).values():
            for m, c in zip(ch.ops, ch.at):
                if m == c:
                    continue
                call = graph.ops[c]
                extra = [t for t in graph.ops[m].inputs
                         if t not in ch.nonmat and graph.storage_root(t) not in ch.nonmat
                         and t not in call.outputs and t not in call.inputs
                         and graph.tensors[t].role in ("activation", "gradient")]
                if extra:
                    out[c] = tuple(dict.fromkeys(out.get(c, ()) + tuple(extra)))
            for c in ch.calls:             # and what its calls read that no member it covers does (SE: h, z)
                call = graph.ops[c]
                made = {t for m in ch.ops if ch.call_of(m) == c for t in graph.ops[m].outputs}
                extra = [t for spec in ch.fusion.emit(graph, ch, call) for t in spec[2]
                         if t not in ch.nonmat and graph.storage_root(t) not in ch.nonmat and t not in made
                         and t not in call.inputs and graph.tensors[t].role in ("activation", "gradient")]
                if extra:
                    out[c] = tuple(dict.fromkeys(out.get(c, ()) + tuple(extra)))
        return out
    return graph.memo("fused_reads", build)


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
        if chain_of(graph, op) is not None:
            out.append("fused")
    elif op.kind in ATTENTION_KINDS:
        out.append("tiled")
    else:
        if (op.kind in INPLACE_KINDS + BACKWARD_INPLACE_KINDS and inplace_legal(graph, op)) \
                or follows_forward_inplace(graph, op):
            out.append("inplace")
        if chain_of(graph, op) is not None:
            out.append("fused")
    return tuple(out)


def fused_into(graph: Graph, op: Op) -> int | None:
    """For a member of a fusable chain other than its key (first member): the key op's id (for a forward
    batch_norm2d or relu of conv -> bn -> relu: the conv's id); None otherwise.

    conv -> bn -> relu covers the forward pass only: the fused kernel writes the conv output (saved for batch
    norm's backward), the statistics and the activation output; the intermediate batch-norm output is never
    materialised. Backward ops stay separate."""
    ch = chain_of(graph, op)
    return ch.ops[0] if ch is not None and op.id != ch.ops[0] else None


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
