"""Fewer llama.cpp threads while other processes keep the cores busy: an online choice of the count.

llama.cpp splits every operation of a forward over its threads, which meet at a barrier after each
operation (hundreds per forward). When another process keeps a core busy, the thread that shares it
waits for a scheduler slice at every barrier, and the whole forward runs at the pace of those waits.
On a 2-core machine with both cores busy, a fixed 2 threads decoded at about a third of the speed of 1
thread (docs/policy.md, "Threads", with the run files), verification included, so a busy machine can
turn speculation into a loss.

:class:`ThreadGovernor` decides the count for each forward from what it measures:

* **Contention** is seen in the CPU time the process gets: a forward run by ``t`` threads that are
  never descheduled takes about ``t`` x its wall time in CPU time (llama.cpp's threads spin at
  barriers). When the median of the last 4 forwards' ``cpu / (wall x t)`` falls below
  :attr:`BUSY_UTILIZATION`, one thread fewer is tried.
* **Starved** (median utilization below :attr:`STARVED_UTILIZATION` over as few as 2 forwards, as
  when another process keeps every core busy: 2 threads then get about one core's worth, 0.5), the
  count drops by one at once, before the prompt's prefill if the shape check of the cost table saw
  it. If a later trial shows that the dropped thread was worth having, such jumps stop for the
  governor's lifetime and only trials change the count.
* **A trial** runs the next :attr:`PROBE_FORWARDS` decode-sized forwards (at most
  :attr:`SMALL_FORWARD` tokens, of a size the current count has timed at least 3 times) with the other
  count; a trial of fewer threads runs every other forward with it too, prefill included, unscored.
  Every scored forward's wall time is divided by the current count's median at its size, and the
  trial's mean ratio is compared with the mean ratio of the current count's last 16 forwards: means,
  not medians, because on a busy machine most forwards take the usual time and a few wait many times
  longer, and those few decide the rate. The count switches when the trial's mean is below
  :attr:`SWITCH_RATIO` x the current one; otherwise the next trial waits twice as many forwards (from
  :attr:`FIRST_WAIT` up to :attr:`MAX_WAIT`).
* Below the full count, one thread more is tried once the machine shows a spare core: the idle time
  of all CPUs since the last look (Linux ``/proc/stat``; where it cannot be read, a trial is simply
  due). At the full count on an idle machine nothing is tried, so an idle machine pays nothing.

The choice changes only *when* work runs, never what is computed, where the logits do not depend on the
thread count: the llama.cpp backend uses it only with exact numerics, whose kernels compute each output
in one fixed order on one thread (tested bitwise for 1 and 2 threads in tests/test_threads.py). Shapes:
counts are ints in [1, max_threads]; times are seconds.
"""

from __future__ import annotations

import os
import statistics
from collections import deque
from collections.abc import Callable

__all__ = ["ProcStatIdle", "ThreadGovernor", "default_threads", "pinned_threads"]


def default_threads() -> int:
    """Physical cores if known, else logical CPUs (llama.cpp is compute-bound per core)."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
        if n:
            return max(1, min(n, len(os.sched_getaffinity(0))))
    except Exception:  # pragma: no cover - psutil is a dependency, but stay robust
        pass
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def pinned_threads(threads: int | None) -> int:
    """``threads``, else :func:`default_threads`: a count given explicitly, so that a backend keeps it
    fixed (benchmarks compare with peers that run a fixed count)."""
    return int(threads) if threads else default_threads()


class ThreadGovernor:
    """Chooses llama.cpp's thread count per forward on a possibly busy machine (see the module doc).

    Args:
        max_threads: the most threads to use (the user's machine's physical cores), >= 1.
        idle_cores: returns how many CPUs were idle on average since its previous reading, or None where
            it cannot tell at all; default :class:`ProcStatIdle` (Linux ``/proc/stat``).

    Raises:
        ValueError: ``max_threads`` < 1.
    """

    SMALL_FORWARD = 16  # forwards of at most this many tokens are timed and compared (decode steps)
    BUSY_UTILIZATION = 0.7  # median CPU time / (wall time x threads) below this: threads wait for cores
    STARVED_UTILIZATION = 0.6  # below this (2 forwards suffice), one thread fewer at once, no trial
    SWITCH_RATIO = 0.85  # switch when the other count takes at most this fraction of the time
    PROBE_FORWARDS = 6  # forwards per trial
    FIRST_WAIT, MAX_WAIT = 4, 256  # forwards between trials: after a switch, and at most
    GIVE_UP = 32  # a trial not decided within this many forwards is dropped (counted as lost)
    SPARE_CORE = 0.6  # idle CPUs (averaged since the last look) that count as a spare core

    def __init__(self, max_threads: int, idle_cores: Callable[[], float | None] | None = None):
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self.max_threads = int(max_threads)
        self._idle_cores = idle_cores if idle_cores is not None else ProcStatIdle()
        self.current = self.max_threads
        self.switches = 0  # how many times the count changed
        self.trials = 0  # how many trials ran to the end
        self._times: dict[tuple[int, int], deque[float]] = {}  # (threads, n tokens) -> recent wall times
        self._utilization: deque[float] = deque(maxlen=4)  # at the current count
        self._ratios: deque[float] = deque(maxlen=16)  # current count: wall / its median at that size
        self._wait = self.FIRST_WAIT
        self._since = 0  # forwards at the current count since the last trial or switch
        self._trial: int | None = None  # the count under trial
        self._trial_ratios: list[float] = []
        self._trial_age = 0
        self._may_jump = True  # a starved count may drop a thread without a trial
        self._jumped = False  # the current count came from such a jump

    # ---- per forward ------------------------------------------------------------------

    def threads_for(self, n_tokens: int) -> int:
        """The count to run a forward of ``n_tokens`` tokens with."""
        if self._trial is not None:
            # a trial of fewer threads (contention seen) runs every forward, prefill included, scored or
            # not: on a busy machine a forward at the full count now and then waits many times its time
            if self._trial < self.current or (n_tokens <= self.SMALL_FORWARD and self._comparable(n_tokens)):
                return self._trial
        return self.current

    def observe(self, threads: int, n_tokens: int, wall_s: float, cpu_s: float) -> None:
        """Record one forward: ``threads`` ran ``n_tokens`` tokens in ``wall_s`` s, using ``cpu_s`` s of CPU."""
        if wall_s <= 0 or n_tokens <= 0:
            return
        if self._trial is not None:
            self._trial_age += 1  # every forward, scored or not: a trial whose sizes never come ends
            if self._trial_age > self.GIVE_UP:
                self._end_trial(switched=False)
        if threads == self.current:  # (a trial's count is never the current one)
            self._utilization.append(max(0.0, cpu_s) / (wall_s * threads))
            if self._trial is None and self._may_jump and self.current > 1 and self.busy(
                    min_samples=2, below=self.STARVED_UTILIZATION):
                self._switch(self.current - 1)
                self._jumped = True
                return
        if n_tokens > self.SMALL_FORWARD:
            return
        if self._trial is not None and threads == self._trial:
            if not self._comparable(n_tokens):
                return
            self._trial_ratios.append(wall_s / self._median(self.current, n_tokens))
            if len(self._trial_ratios) >= self.PROBE_FORWARDS:
                self._decide()
            return
        if threads != self.current:
            return
        self._times.setdefault((threads, n_tokens), deque(maxlen=5)).append(wall_s)
        if self._comparable(n_tokens):
            self._ratios.append(wall_s / self._median(threads, n_tokens))
        self._since += 1
        if self._trial is None and self._since >= self._wait and len(self._ratios) >= self._ratios.maxlen // 4:
            alt = self._alternative()
            if alt is not None:
                self._trial, self._trial_ratios, self._trial_age = alt, [], 0

    # ---- decisions ----------------------------------------------------------------------

    def busy(self, min_samples: int = 4, below: float | None = None) -> bool:
        """True when the last (up to 4, at least ``min_samples``) forwards at the current count got too
        little CPU time (median utilization below ``below``, default :attr:`BUSY_UTILIZATION`): their
        threads waited for cores that other processes held."""
        u = self._utilization
        return len(u) >= min_samples and statistics.median(u) < (self.BUSY_UTILIZATION if below is None else below)

    def _alternative(self) -> int | None:
        if self.busy() and self.current > 1:
            return self.current - 1
        if self.current < self.max_threads:
            idle = self._idle_cores()
            if idle is None or idle >= self.SPARE_CORE:
                return self.current + 1
            self._since = 0  # no spare core yet: look again after as many forwards, without backing off
        return None

    def _comparable(self, n_tokens: int) -> bool:
        d = self._times.get((self.current, n_tokens))
        return d is not None and len(d) >= 3

    def _median(self, threads: int, n_tokens: int) -> float:
        return statistics.median(self._times[(threads, n_tokens)])

    def _decide(self) -> None:
        self.trials += 1
        if statistics.fmean(self._trial_ratios) < self.SWITCH_RATIO * statistics.fmean(self._ratios):
            if self._trial > self.current and self._jumped:
                self._may_jump = False  # a jump down was wrong under this load: from now on, trials only
            self._switch(self._trial)
        else:
            self._end_trial(switched=False)

    def _switch(self, threads: int) -> None:
        self.current = threads
        self.switches += 1
        self._jumped = False
        self._end_trial(switched=True)

    def _end_trial(self, switched: bool) -> None:
        self._wait = self.FIRST_WAIT if switched else min(2 * self._wait, self.MAX_WAIT)
        if switched:
            self._utilization.clear()
            self._ratios.clear()
        self._trial, self._trial_ratios, self._since = None, [], 0


class ProcStatIdle:
    """Idle CPUs, averaged since the previous reading, from the first line of Linux's ``/proc/stat``.

    Returns None where ``/proc/stat`` cannot be read (then the governor simply tries), and 0.0 (no
    spare core seen yet) on the first call or while less than ``min_interval_s`` passed since the last
    reading (the counters tick at 100 Hz); the reading is kept until that much time has passed."""

    def __init__(self, min_interval_s: float = 0.2, path: str = "/proc/stat"):
        self.path, self.min_jiffies = path, 100 * min_interval_s
        self.cpus = os.cpu_count() or 1
        self._last: tuple[int, int] | None = None

    def _read(self) -> tuple[int, int] | None:
        try:
            with open(self.path) as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        if len(fields) < 5:
            return None
        return fields[3] + fields[4], sum(fields[:8])  # idle + iowait, and all time but guest

    def __call__(self) -> float | None:
        now = self._read()
        if now is None:
            return None
        if self._last is None or now[1] - self._last[1] < self.min_jiffies * self.cpus:
            self._last = self._last or now
            return 0.0
        d_idle, d_total = now[0] - self._last[0], now[1] - self._last[1]
        self._last = now
        return self.cpus * d_idle / d_total
