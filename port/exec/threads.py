"""Thread governor: the kernel thread count a training loop runs with, chosen from its own step times.

Why: on a machine another process keeps busy, a 2-thread step pays for every parallel region's barrier. Measured
on a 2-vCPU VM (2026-11-24, MobileNetV2 batch 8, all-C plan, one Python busy loop beside it): with libgomp's
spinning waits the step went from 55 ms to 224 ms (median; 105-375 ms), with passive waits it never got faster
than one thread (96 ms quiet), and one thread ran 94 ms quiet and 96 ms loaded. The fastest count depends on the
load at the time, which only the running steps see.

:class:`ThreadGovernor` is the decision, pure (step times in, the next step's count out): it runs the largest
count; when that count's recent steps are ``slow_ratio`` x slower than its best, or when a probe is due, it
tries the next other candidate for ``probe_steps`` steps and keeps whichever is faster (the probe's best step
against the running count's recent median, by ``margin``). At the largest count each other candidate is probed
once, ``first_probe`` steps after the warm-up (a small net may run faster on fewer threads even on a quiet
machine); after that only a slowdown starts a probe there, since a load that appears shows as one. Below the
largest count probes are due ``first_probe`` steps after a switch, then at doubling intervals up to
``probe_every``: they bring it back to more threads once the load is gone, at a cost of ``probe_steps`` slower
steps per interval while the load lasts.

The C kernels give the same bits at any thread count (kernels/include/port_kernels.h, "Threads"), so a governed
run is bitwise the run of a fixed count: ``Trainer`` governs its steps by default (``threads="auto"``).
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class GovernorEvent:
    """One decision: at ``step`` the governor moved from ``from_threads`` to ``to_threads`` (``why``: "probe",
    "slow", "faster", "kept")."""
    step: int
    from_threads: int
    to_threads: int
    why: str


class ThreadGovernor:
    def __init__(self, max_threads: int, probe_every: int = 64, probe_steps: int = 2, window: int = 5,
                 slow_ratio: float = 1.3, margin: float = 0.9, first_probe: int = 8, warmup: int = 3):
        if max_threads < 1:
            raise ValueError(f"ThreadGovernor: max_threads must be >= 1, got {max_threads}")
        self.candidates = sorted({max_threads, max(1, max_threads // 2), 1}, reverse=True)
        self.probe_every, self.probe_steps, self.slow_ratio, self.margin = probe_every, probe_steps, slow_ratio, margin
        self.first_probe = min(first_probe, probe_every)
        self.interval = self.first_probe     # steps until the next probe; doubles while probes lose
        self.recent = {n: deque(maxlen=window) for n in self.candidates}
        self.best = {n: float("inf") for n in self.candidates}     # the lowest recent median seen per count
        self.home = max_threads          # the count steps run with outside probes
        self.current = max_threads
        self.steps = 0
        self.warmup = warmup             # the first steps (caches, page faults, thread start-up) are not evidence
        self._since_probe = 0
        self._probe_left = 0
        self._next_probe = 0             # index into the other candidates, rotating
        self._first_round = len(self.candidates) - 1     # probes left that the largest count makes unprompted
        self.events: list[GovernorEvent] = []

    def _median(self, n: int) -> float:
        r = self.recent[n]
        return statistics.median(r) if r else float("inf")

    def record(self, step_ms: float) -> int:
        """The last step (run with ``self.current`` threads) took ``step_ms``; returns the next step's count."""
        n = self.current
        self.steps += 1
        if self.steps <= self.warmup:
            return n
        self.recent[n].append(float(step_ms))
        if len(self.recent[n]) >= min(3, self.recent[n].maxlen):
            self.best[n] = min(self.best[n], self._median(n))
        if self._probe_left > 0:                 # in a probe of count n
            self._probe_left -= 1
            if self._probe_left > 0:
                return n
            probe = list(self.recent[n])[-self.probe_steps:]
            if min(probe) < self._median(self.home) * self.margin:
                self.events.append(GovernorEvent(self.steps, self.home, n, "faster"))
                self.home = n
                self.recent[n].clear()
                self.recent[n].extend(probe)
                self.interval = self.first_probe
            else:
                self.events.append(GovernorEvent(self.steps, n, self.home, "kept"))
                self.interval = min(self.probe_every, 2 * self.interval)
            self.current = self.home
            self._since_probe = 0
            return self.current
        self._since_probe += 1
        others = [c for c in self.candidates if c != self.home]
        if not others or len(self.recent[n]) < self.recent[n].maxlen:     # a full window of evidence first
            return n
        slow = self._median(n) > self.best[n] * self.slow_ratio
        due = self._since_probe >= self.interval and (n != self.candidates[0] or self._first_round > 0)
        if slow or due:
            if n == self.candidates[0] and self._first_round > 0:
                self._first_round -= 1
            c = others[self._next_probe % len(others)]
            self._next_probe += 1
            self.events.append(GovernorEvent(self.steps, n, c, "slow" if slow else "probe"))
            self.current, self._probe_left = c, self.probe_steps
            if slow:                              # its best no longer describes this machine's state
                self.best[n] = self._median(n)
        return self.current
