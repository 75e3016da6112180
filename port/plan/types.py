"""Plan types: what the solver decided, verified by port.verify.simulate before anyone uses it."""
from __future__ import annotations

from dataclasses import dataclass

PLAN_FORMAT_VERSION = 1


# =============================================================================================
# plan: what the solver decided, verified by port.verify.simulate before anyone uses it
# =============================================================================================
@dataclass(frozen=True)
class OpDecision:
    op: int                   # op id in the graph
    accelerator: str
    variant: str              # see port.plan.variants


@dataclass(frozen=True)
class Plan:
    """Decisions for one (graph, profile, budget).

    ops: one decision per graph op, in op-id order.
    recompute: ids of saved activation tensors that are dropped after the forward pass and recomputed
      (by re-running their producer op on its planned accelerator) during the backward pass.
    recompute_at: the recompute schedule, ((forward op id to re-run, id of the op before which it runs), ...)
      sorted by (step, op id). Empty means each recomputed producer runs right before the first backward op
      that reads one of its outputs (port.plan.semantics.recompute_times). Chains: a producer may be re-run earlier
      than its own first use because a later-recomputed consumer needs it. Multi-level: a producer may be
      listed at several steps; each re-run makes a new copy of its outputs, used until the next re-run.
    inplace_reruns: re-runs ((op id, step), each also in the recompute schedule) that write their output over
      their first input's copy instead of a new buffer: a relu, relu6 or add whose first input is read by it
      alone and was re-made in the same recompute group, with that copy's last use this re-run
      (port.plan.semantics, rule 2; port.plan.variants.rerun_inplace_inputs).
    paged: ids of saved activation tensors written to storage after the forward pass and read back before use,
      and of optimizer-state tensors kept in storage between their updates (paged in for the step their update
      runs at, out after it: port.plan.semantics, rules 1 and 5).
    early_updates: ids of update ops run as soon as their gradient is complete (in-place gradient update, as
      in the Tiny Training Engine) instead of after the whole backward pass; their gradient buffer then lives
      only between its producer and the update. Not legal with micro-batching (gradients must accumulate).
    own_memory: the accelerators whose engines have their own memory on the profile's device (the profile decides;
      the solver copies it here so that lowering and the Trainer follow it without being told).
    joins: explicit joins of a queued engine's queue ((accelerator, step), sorted, once each): the host waits for
      that queue right after step t's op and early updates, before its page-outs and frees (port.plan.semantics,
      rule 8: the bytes the queue used are freed there instead of at its next hand-off or the pass end).
    """

    graph_digest: str
    profile_digest: str
    budget_bytes: int
    ops: tuple[OpDecision, ...]
    recompute: tuple[int, ...] = ()
    recompute_at: tuple[tuple[int, int], ...] = ()
    inplace_reruns: tuple[tuple[int, int], ...] = ()
    paged: tuple[int, ...] = ()
    early_updates: tuple[int, ...] = ()
    solver: str = "default"
    status: str = "feasible"              # optimal | feasible | infeasible | timeout
    objective_ms: float = 0.0             # the solver's objective
    gap: float = 0.0                      # proven relative gap (0 for optimal)
    solve_time_s: float = 0.0
    predicted_step_ms: float = 0.0        # from port.verify.simulate, not from solver variables
    predicted_peak_bytes: int = 0
    memory_timeline: tuple[int, ...] = () # bytes live after each executed step (simulate's order)
    batch_size: int = 0                   # the batch the plan's graph runs per program pass (0: not recorded)
    own_memory: tuple[str, ...] = ()      # accelerators with their own memory, from the profile it was solved on
    #                                       (Profile.own_memory): lowering gives their backends their own arena
    joins: tuple[tuple[str, int], ...] = ()

    def decision(self, op_id: int) -> OpDecision:
        return self.ops[op_id]
