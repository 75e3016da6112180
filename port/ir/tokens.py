"""Token ids against the embeddings that look them up (issue 53): an id outside ``[0, num_embeddings)`` or a
sequence longer than a model's position embedding is refused with port.errors.TokenError, naming the input,
the value, where it is, the embedding and its size, before the step (or the profile, the arena) runs. Without
the check the C embedding kernel stops the pass with "invalid scalar argument" (and PyTorch with "index out
of range in self"), which names none of them.

Two sources of indices are followed back from each forward ``embedding`` op through ops that pass ids through
unchanged (``reshape``: views, slices; ``permute``): a model input (token ids: the values are checked, at
trace time on the example and on every batch the Trainer runs), an ``arange`` (positions
``start .. start + T - 1``: the sequence length is checked once, on the graph) and a constant the capture
folded (position ids made from shapes and buffers, port.ir.fold: its values, made from the model's buffers, are
checked once at trace time)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from port.errors import TokenError

PASS_THROUGH = ("reshape", "permute")       # ops whose output holds the same ids as their first input


@dataclass(frozen=True)
class TokenBound:
    input: int          # position of the model input among the graph's inputs (0: the main input)
    embedding: str      # the embedding op's name (its module path)
    rows: int           # num_embeddings: ids must lie in [0, rows)


def _origin(graph: Any, tid: int) -> tuple[int, Any]:
    """(tensor id, the op that makes it or None): ``tid`` followed back through PASS_THROUGH ops."""
    prod = graph.producers()
    while tid in prod:
        op = graph.ops[prod[tid]]
        if op.kind not in PASS_THROUGH or not op.inputs:
            return tid, op
        tid = op.inputs[0]
    return tid, None


def _embeddings(graph: Any):
    """(embedding op, where its indices come from: a model input's position, the op that makes them or a folded
    constant's name, rows) for every forward embedding of ``graph``."""
    from port.ir.fold import is_folded
    inputs = {t: k for k, t in enumerate(graph.input_ids)}
    for op in graph.ops:
        if op.kind != "embedding" or len(op.inputs) < 2:
            continue
        tid, src = _origin(graph, op.inputs[0])
        name = graph.tensors[tid].name
        yield op, inputs.get(tid, name if src is None and is_folded(name) else src), \
            int(graph.tensors[op.inputs[1]].shape[0])


def token_bounds(graph: Any) -> tuple[TokenBound, ...]:
    """The embeddings that look up a model input's values directly (token ids), one bound each."""
    return tuple(TokenBound(src, op.name, rows) for op, src, rows in _embeddings(graph) if isinstance(src, int))


def check_positions(graph: Any, what: str = "example_input", model: Any = None) -> None:
    """TokenError when an ``arange`` of positions (the sequence length) reaches past an embedding's rows; with
    ``model``, also when a folded constant of indices does (position ids the capture folded, port.ir.fold: its
    values made from ``model``'s buffers)."""
    from port.ir.fold import model_constants
    recipes = dict(graph.constants)
    if model is not None and any(b.is_meta for b in model.buffers()):
        model = None                # an inference capture's weightless copy: its training twin was checked
    for op, src, rows in _embeddings(graph):
        if isinstance(src, str) and model is not None:     # a folded constant: its values
            v = model_constants([(src, recipes[src])], model)[src]
            if v.numel() == 0:
                continue
            start, hi, n = int(v.min()), int(v.max()), int(v.shape[-1]) if v.dim() else 1
        elif src is None or isinstance(src, (int, str)) or src.kind != "arange":
            continue
        else:
            start = int(src.attr("start", 0) or 0)
            n = int(graph.tensors[src.outputs[0]].shape[0]) if graph.tensors[src.outputs[0]].shape else 1
            hi = start + n - 1
        if start < 0 or hi >= rows:
            raise TokenError(
                f"{what}: the sequence length {n} is longer than the model's context: embedding {op.name!r} has "
                f"{rows} positions (0..{rows - 1}) and this sequence needs positions {start}..{hi}. Fix: "
                f"sequences of at most {rows - start} tokens (crop or window them), or a model built with a "
                f"context of at least {hi + 1}", kind="length")


def check_tokens(bounds: Sequence[TokenBound], values: Sequence[Any], names: Sequence[str]) -> None:
    """TokenError naming the first id outside its embedding's range: ``values[b.input]`` (a tensor of ids,
    named ``names[b.input]``) for each bound ``b``."""
    import torch
    for b in bounds:
        v = values[b.input] if b.input < len(values) else None
        if v is None or v.numel() == 0 or v.is_floating_point() or v.dtype == torch.bool:
            continue
        lo, hi = (int(t) for t in v.aminmax())
        if lo >= 0 and hi < b.rows:
            continue
        bad = ((v < 0) | (v >= b.rows)).nonzero()[0].tolist()
        raise TokenError(f"{names[b.input]}: token id {int(v[tuple(bad)])} at index {bad} is outside the "
                         f"vocabulary of embedding {b.embedding!r}: expected 0 <= id < {b.rows} (its "
                         f"num_embeddings). Fix: map the ids into the model's vocabulary (or build the model with "
                         f"a larger one)")


def check_example(graph: Any, named: Sequence[tuple[str, Any]], model: Any = None) -> None:
    """Trace time: the example's token ids and sequence length against the graph's embeddings."""
    main = "example_input" if len(named) == 1 else f"example_input[{named[0][0]!r}]"
    check_positions(graph, main, model)
    check_tokens(token_bounds(graph), [v for _, v in named],
                 [main] + [f"example_input[{k!r}]" for k, _ in named[1:]])


def explain_float_ids(jobs: Sequence[tuple], error: Exception) -> None:
    """A capture failed because an embedding got floating-point indices (torch: "Expected tensor for argument
    #1 'indices' to have one of the following scalar types"): raise a TokenError naming the example input and
    the embedding instead. ``jobs``: the captures' (model, example_input, ...) tuples."""
    import torch
    if "'indices'" not in str(error):
        return
    for model, example, *_ in jobs:
        from port.ir.inputs import example_inputs
        floats = [k for k, v in example_inputs(example) if v.is_floating_point()]
        embs = [f"{n} ({m.num_embeddings} ids)" for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)]
        if floats and embs:
            where = "example_input" if floats[0] == "input" else f"example_input[{floats[0]!r}]"
            raise TokenError(f"{where}: the model looks its values up in an embedding ({', '.join(embs[:4])}), "
                             f"which takes token ids of an integer dtype (int64), not "
                             f"{dict(example_inputs(example))[floats[0]].dtype}. Fix: pass token ids as int64 "
                             f"(x.long() if the values are whole numbers)", kind="dtype") from None
