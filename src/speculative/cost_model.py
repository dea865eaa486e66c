"""The cost model: what a verification pass costs, and how many draft tokens are worth verifying.

Leviathan et al. 2023 (section 3.4) analyse speculative decoding with a cost
ratio c between drafter and target and a per-token acceptance rate alpha: a
step of k draft tokens yields on average (1 - alpha^(k+1)) / (1 - alpha)
tokens. On hardware where verification is compute-bound (small models on a
few CPU cores) the target's cost T(n) of a forward over n tokens grows almost
linearly in n, so long drafts only pay when acceptance is very high. This
module measures T(n) and picks, per step, the draft length that maximizes the
long-run throughput.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .backends.base import Backend, ForwardRequest

#: forward sizes measured by :func:`measure_verify_cost`
PROFILE_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
#: relative change of T(1) between the start and the end of a measurement beyond which it is not cached
STEADY_TOLERANCE = 0.3
#: a live timing counts as at most this many times the current estimate of its size (:meth:`CostModel.update`)
OUTLIER_CAP = 2.0
#: the forward size whose T(n)/T(1) checks a cached table's shape (k + 1 at the default k = 4)
SHAPE_PROBE_SIZE = 5
#: relative difference of that ratio, cached against measured now, beyond which the table is measured again
SHAPE_TOLERANCE = 0.25


@dataclass
class CostModel:
    """Verification cost T(n), seconds per target forward over n tokens with logits at every position.

    Holds a measured table (``sizes`` -> ``seconds``), interpolated linearly
    between sizes and extrapolated by the last slope, and refines it online
    from the engine's own timings (exponential moving average per n). Sizes
    not yet timed live follow the live ones in proportion: the table's shape
    comes from the measurement, its scale from today's machine (a table
    measured while the machine was busy would otherwise keep, say, T(8) of a
    busy machine against T(1) of a quiet one, and never draft again).
    A table read from the cache is written back when its T(1) has drifted
    (:meth:`save_if_drifted`), so a bad measurement does not last.

    Attributes:
        sizes: forward sizes n (tokens), increasing.
        seconds: T(n) for each size.
        context_tokens: context length the table was measured at.
    """

    sizes: list[int] = field(default_factory=lambda: [1, 2])
    seconds: list[float] = field(default_factory=lambda: [0.01, 0.02])
    context_tokens: int = 0
    ema: float = 0.1
    #: sizes timed live in this process (the others are scaled along with them)
    live: set = field(default_factory=set, repr=False, compare=False)
    _measured: dict | None = field(default=None, repr=False, compare=False)  # the table before live timings
    _envelope: tuple | None = field(default=None, repr=False, compare=False)  # (key, envelope()) of the last read
    #: where the table is cached, and its T(1) there (see :meth:`save_if_drifted`)
    cache_path: object = field(default=None, repr=False, compare=False)
    saved_t1: float = field(default=0.0, repr=False, compare=False)
    saved_at: float = field(default=-math.inf, repr=False, compare=False)
    #: False when the machine's load changed while the table was measured (see :func:`measure_verify_cost`)
    steady: bool = field(default=True, repr=False, compare=False)

    def time(self, n: int) -> float:
        """Estimated T(n) in seconds (n >= 1), read through the table's monotone envelope.

        A forward over n tokens costs no more than one over more tokens, so the table is read as a
        non-decreasing one (:meth:`envelope`), then interpolated; past the largest size it is extrapolated
        by the envelope's last slope (its mean slope where the last segment came out flat).
        """
        xs, ys = self.sizes, self.envelope()
        if n <= xs[0]:
            return ys[0] * n / xs[0]
        if n >= xs[-1]:
            if len(xs) == 1:
                return ys[-1] * n / xs[-1]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) or (ys[-1] - ys[0]) / (xs[-1] - xs[0])
            return ys[-1] + slope * (n - xs[-1])
        return float(np.interp(n, xs, ys))

    def envelope(self) -> list[float]:
        """The table's entries made non-decreasing in n, as :meth:`time` reads them (cached until they change).

        Where two sizes disagree (a smaller one costing more) the lower entry wins, on purpose: a size the
        table overstates is one the policy never verifies, so live timings never correct it (a table with
        T(2) at 1.53 T(1) against 1.16-1.23 for T(3)-T(5) had the policy verify no single-token draft in 6
        development prompts with 4 drafters: docs/policy.md), while an understated size gets verified and
        timed at once. Three exceptions keep the lower entry from being merely the luckier of two noisy
        ones: the smallest size (T(1), plain decoding's step: the most timed entry, the reference of the
        policy's rate and savings) keeps its own value and every other size reads at least as much; a size
        timed live in this process is lowered only by other live sizes, never by an entry that merely
        follows them in proportion; such an entry is raised instead to the live sizes below it. With
        nothing timed live (a table just read or measured) this is the suffix minimum, floored at T(1).
        """
        key = (tuple(self.seconds), tuple(self.sizes), len(self.live))
        if self._envelope is not None and self._envelope[0] == key:
            return self._envelope[1]
        ys = list(self.seconds)
        live = [x in self.live for x in self.sizes]
        low_all = low_live = math.inf
        for i in range(len(ys) - 1, 0, -1):  # from the top: each entry at most those above it (T(1) kept)
            ys[i] = min(ys[i], low_live if live[i] else low_all)
            low_all = min(low_all, ys[i])
            if live[i]:
                low_live = min(low_live, ys[i])
        high = ys[0]
        for i in range(1, len(ys)):  # from the bottom: at least T(1); one that follows the live ones, at least those
            if live[i]:
                ys[i] = max(ys[i], ys[0])
                high = max(high, ys[i])
            else:
                ys[i] = max(ys[i], high)
        self._envelope = (key, ys)
        return ys

    def update(self, n: int, seconds: float) -> None:
        """Fold one measured forward of n tokens into the table; sizes not timed live yet scale along.

        A timing more than :data:`OUTLIER_CAP` times the current estimate of its size counts as that cap.

        The scale of the sizes not timed live is the geometric mean, over the table's sizes that
        were, of their live value over their measured one: one factor for the whole table (a
        product of each size's drift would compound noise across sizes).
        """
        if self._measured is None:
            self._measured = dict(zip(self.sizes, self.seconds))
        if n in self.sizes:
            i = self.sizes.index(n)
            if n not in self.live:  # a size's first live timing starts from what the table was read as
                self.seconds[i] = min(self.seconds[i], self.envelope()[i])
            # a stall (a page fault, another process) is one slow sample, never a fast one: capped at twice
            # the estimate, it moves a rarely timed size by 10% at most, while a real slow-down still
            # shows within a few samples
            seconds = min(seconds, OUTLIER_CAP * self.seconds[i])
            self.seconds[i] += self.ema * (seconds - self.seconds[i])
        else:
            self.sizes.append(n)
            self.seconds.append(seconds)
            order = np.argsort(self.sizes)
            self.sizes = [self.sizes[i] for i in order]
            self.seconds = [self.seconds[i] for i in order]
        self.live.add(n)
        now = dict(zip(self.sizes, self.seconds))
        logs = [math.log(now[m] / t) for m, t in self._measured.items() if m in self.live and t > 0 and now[m] > 0]
        if logs:
            scale = math.exp(sum(logs) / len(logs))
            self.seconds = [now[m] if m in self.live else self._measured[m] * scale for m in self.sizes]

    def ceiling(self, k: int) -> float:
        """Best possible speedup at perfect acceptance with k draft tokens and a free drafter: (k+1)·T(1)/T(k+1)."""
        return (k + 1) * self.time(1) / self.time(k + 1)

    def save_if_drifted(self, rel: float = 0.2, min_interval_s: float = 60.0) -> bool:
        """Write the refined table back to its cache file when T(1) differs from the stored one by more
        than ``rel`` (relative), at most once per ``min_interval_s``. Returns True when written."""
        if self.cache_path is None or self.saved_t1 <= 0:
            return False
        t1 = self.time(1)
        now = time.monotonic()
        if abs(t1 / self.saved_t1 - 1.0) <= rel or now - self.saved_at < min_interval_s:
            return False
        from .cache import read_json, write_json_atomic

        write_json_atomic(self.cache_path, {**read_json(self.cache_path), **self.to_dict()})
        self.saved_t1, self.saved_at = t1, now
        return True

    def to_dict(self) -> dict:
        return {"sizes": list(self.sizes), "seconds": list(self.seconds), "context_tokens": self.context_tokens}

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        return cls(sizes=list(d["sizes"]), seconds=list(d["seconds"]), context_tokens=int(d.get("context_tokens", 0)))


def _timed_forwards(backend: Backend, context_tokens: int, plan: Sequence[Sequence[int]], seq_id: int,
                    seed: int, skip_if_contended: bool = False) -> list[list[float]] | None:
    """Prefill ``context_tokens`` random tokens in ``seq_id``, run one warm-up forward, then time one
    forward (logits at every position, rolled back after) per size of each row of ``plan``, in order.
    Returns the seconds in ``plan``'s shape, or None when ``skip_if_contended`` and the backend saw
    other processes holding the cores during the first two forwards or at the end; the sequence's cache
    is cleared at the end."""
    rng = np.random.default_rng(seed)
    hi = min(backend.vocab_size, 30000)
    ctx = rng.integers(100, hi, size=context_tokens).tolist()
    block = rng.integers(100, hi, size=max(max(row) for row in plan)).tolist()
    backend.truncate(seq_id, 0)

    def timed(n: int) -> float:
        t = time.perf_counter()
        backend.forward([ForwardRequest(seq_id, block[:n], logits="all")])
        seconds = time.perf_counter() - t
        backend.truncate(seq_id, context_tokens)
        return seconds

    with backend.threads_held():
        try:
            if ctx:
                backend.forward([ForwardRequest(seq_id, ctx, logits="none")])
            backend.forward([ForwardRequest(seq_id, block[:2], logits="all")])  # warm-up
            backend.truncate(seq_id, context_tokens)
            if skip_if_contended and backend.contended():
                return None
            out = [[timed(n) for n in row] for row in plan]
            return None if skip_if_contended and backend.contended() else out  # the load may come mid-way
        finally:
            backend.truncate(seq_id, 0)


def measure_verify_cost(
    backend: Backend,
    sizes: Sequence[int] = PROFILE_SIZES,
    context_tokens: int = 256,
    repeats: int = 3,
    seq_id: int = 0,
) -> CostModel:
    """Measure T(n): per size, the median over ``repeats`` interleaved rounds of one forward over n tokens
    with logits at every position.

    A context of ``context_tokens`` tokens is prefilled first; every timed forward is rolled back
    afterwards, and the sequence's cache is cleared at the end. Each round times every size once, in
    turn, so that a burst of load on the machine slows one round of every size rather than every
    forward of a few sizes (timing the sizes one after another once cached T(2) = 2.3·T(1) for a
    target whose true ratio is 1.03, and the policy then never drafted again). The smallest size is
    timed again at the end (median of ``repeats``): the result's ``steady`` is False when it differs
    from the rounds' T(1) by more than :data:`STEADY_TOLERANCE` (the machine's load changed).
    """
    sizes = list(sizes)
    *rounds, again = _timed_forwards(backend, context_tokens, [sizes] * repeats + [[sizes[0]] * repeats], seq_id, 0)
    t1_again = float(np.median(again))
    out = np.median(np.asarray(rounds), axis=0)
    steady = abs(t1_again / out[0] - 1.0) <= STEADY_TOLERANCE if out[0] > 0 else False
    out = np.maximum.accumulate(out).tolist()  # costs never fall with more tokens: smooth out timer noise
    return CostModel(sizes=sizes, seconds=out, context_tokens=context_tokens, steady=steady)


def measured_ratio(backend: Backend, n: int = SHAPE_PROBE_SIZE, context_tokens: int = 32, rounds: int = 3,
                   seq_id: int = 0) -> float | None:
    """T(n)/T(1) measured now: the median over ``rounds`` interleaved pairs of a 1-token and an n-token
    forward after ``context_tokens`` tokens of context (rolled back; the sequence is cleared at the end).
    About 2·rounds + 2 forwards: the quick check of a cached table's shape (:func:`cached_verify_cost`).
    None when the first two forwards, or the last ones, showed other processes holding the cores
    (``backend.contended()``): timings then measure the load, and on a busy machine each can take seconds."""
    pairs = _timed_forwards(backend, context_tokens, [[1, n]] * rounds, seq_id, 1, skip_if_contended=True)
    if pairs is None:
        return None
    ratios = [b / a for a, b in pairs if a > 0]
    return float(np.median(ratios)) if ratios else 1.0


def cached_verify_cost(backend: Backend) -> CostModel:
    """The backend's :class:`CostModel` from the cache folder, measured (a few seconds) and stored if missing.

    A measurement during which the machine's load changed (``steady`` False) is repeated once, and
    not cached if it is still unsteady. A cached table's shape is checked first (T(n)/T(1) at
    n = :data:`SHAPE_PROBE_SIZE`, :func:`measured_ratio`, a few forwards): off by more than
    :data:`SHAPE_TOLERANCE` from the table's in two checks, on the same side, it is measured again
    (skipped, the table kept, when other processes hold the cores), since the online refinement only
    corrects the sizes the policy verifies, and a table that overstates T(n) keeps the policy from
    ever verifying them; if that new measurement stays unsteady, the cached table is kept (the load that
    bent the check bent the measurement too). The returned model remembers its cache file, so that
    :meth:`CostModel.save_if_drifted` can correct its scale later.
    """
    from .cache import cache_dir, read_json, write_json_atomic

    key = backend.cost_key()
    path = cache_dir("cost") / f"{key}.json"
    data = read_json(path)
    model = CostModel.from_dict(data) if data.get("sizes") else None
    if model is not None and (len(model.seconds) != len(model.sizes) or min(model.seconds) <= 0):
        model = None  # a damaged cache file: measured again
    probe = SHAPE_PROBE_SIZE
    stale = None  # a cached table the shape check found out of date
    if model is not None and backend.n_ctx > 32 + probe:
        cached = model.time(probe) / model.time(1)

        def off(ratio: float) -> float:  # signed distance on the log scale, 0 within the tolerance
            d = math.log(ratio / cached)
            return d if abs(d) > math.log(1.0 + SHAPE_TOLERANCE) else 0.0

        live = measured_ratio(backend, probe)
        if live is None:  # other processes hold the cores: kept unchecked this time
            live = cached
        if off(live):  # a burst of load can bend one check: a second one must agree before re-measuring
            again = measured_ratio(backend, probe)
            live = live if again is not None and off(again) * off(live) > 0 else cached
        if off(live):
            stale = model
            print(f"[speculative] the cached cost of {backend.model_id}'s forward passes is out of date "
                  f"(T({probe})/T(1) = {cached:.2f} cached, {live:.2f} now): measuring again",
                  file=sys.stderr, flush=True)
            model = None
    if model is None:
        context_tokens = 256
        if backend.n_ctx < context_tokens + max(PROFILE_SIZES):
            # a window too small for the standard measurement: measure what fits, for this backend only
            sizes = [s for s in PROFILE_SIZES if s < backend.n_ctx] or [1]
            return measure_verify_cost(backend, sizes=sizes, context_tokens=max(0, backend.n_ctx - 1 - max(sizes)),
                                       repeats=3)
        print(f"[speculative] measuring the cost of {backend.model_id}'s forward passes T(n) on this machine "
              f"(cached under {path.parent})", file=sys.stderr, flush=True)
        model = measure_verify_cost(backend, PROFILE_SIZES, context_tokens=context_tokens, repeats=3)
        if not model.steady:  # measured while the load changed: once more, and cache it only if steady
            model = measure_verify_cost(backend, PROFILE_SIZES, context_tokens=context_tokens, repeats=3)
        if not model.steady:
            if stale is not None:  # the load that bent the check bends the measurement too: keep the cached table
                print(f"[speculative] the new measurement of {backend.model_id}'s forward passes was unsteady (the "
                      "machine's load changed): the cached one is kept", file=sys.stderr, flush=True)
                stale.cache_path, stale.saved_t1 = path, stale.time(1)
                return stale
            return model  # used in this process only (and refined online)
        write_json_atomic(path, {**model.to_dict(), "model": backend.model_id, "backend": backend.name})
    model.cache_path, model.saved_t1 = path, model.time(1)
    return model


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens per step, (1 - alpha^(k+1)) / (1 - alpha), for i.i.d. acceptance alpha (Leviathan et al., eq. 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_tau(tau: float, k: int) -> float:
    """Solve (1 - alpha^(k+1)) / (1 - alpha) = tau for alpha in [0, 1] (bisection).

    Args:
        tau: mean tokens per speculative step, in [1, k+1].
        k: draft tokens per step.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    if tau <= 1.0:
        return 0.0
    if tau >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def predicted_speedup(tau: float, k: int, t_draft: float, t1: float, tk1: float) -> float:
    """Speedup over plain decoding predicted from measurements: S = tau·T(1) / (k·t_draft + T(k+1)).

    Args:
        tau: mean accepted tokens per step.
        k: draft tokens per step.
        t_draft: drafter's time per draft token (seconds).
        t1: target forward time for 1 token (seconds).
        tk1: target forward time for k+1 tokens (seconds).
    """
    return tau * t1 / (k * t_draft + tk1)


def drafting_gain_per_token(alpha: float, t_draft: float, cost: CostModel, k: int) -> float:
    """Seconds saved per generated token by drafting, at the best draft length m <= k (>= 0).

    A step of m draft tokens costs m·t_draft + T(m+1) and yields (1 - alpha^(m+1)) / (1 - alpha)
    tokens (Leviathan et al. 2023, section 3.4, with the measured T(n) in place of their constant
    cost ratio); plain decoding costs T(1) per token. Returns max(0, max_m T(1) - cost/tokens).

    Args:
        alpha: per-token acceptance rate, in [0, 1].
        t_draft: the drafter's seconds per draft token.
        cost: the target's verification cost T(n).
        k: the longest draft.
    """
    t1 = cost.time(1)
    best = 0.0
    for m in range(1, max(1, k) + 1):
        best = max(best, t1 - (m * t_draft + cost.time(m + 1)) / expected_tokens(alpha, m))
    return best


def choose_draft_length(confidence: Sequence[float], cost: CostModel, rate: float) -> int:
    """How many leading draft tokens to verify.

    Maximizes E[tokens] - rate·T(m+1) over m (renewal-reward form of
    throughput maximization: ``rate`` is the long-run tokens per second the
    decoder achieves, at least plain decoding's 1/T(1)), where E[tokens] =
    1 + sum_i prod_{j<=i} confidence_j and confidence_i estimates the
    probability that draft token i is accepted given the tokens before it were.

    Returns:
        m in 0..len(confidence).
    """
    best_m, best = 0, 1.0 - rate * cost.time(1)
    cum, e = 1.0, 1.0
    for m, c in enumerate(confidence, start=1):
        cum *= max(0.0, min(1.0, c))
        e += cum
        score = e - rate * cost.time(m + 1)
        if score > best:
            best_m, best = m, score
        if cum < 1e-3:
            break
    return best_m


def choose_tree_nodes(parents: Sequence[int], confidence: Sequence[float], cost: CostModel, rate: float,
                      base_tokens: int = 1, allowed: Sequence[int] | None = None) -> list[int]:
    """Which nodes of a token tree to verify (EAGLE-2's re-ranking by path probability, Li et al. 2024b).

    A node's value is the product of the confidences on its path: the probability
    that it is reached and accepted, i.e. its contribution to the expected tokens
    per step. Nodes are added in decreasing value (a parent never has a lower value
    than its child, so every prefix of that order is a tree), and the prefix that
    maximizes  sum(values) - rate * T(base_tokens + size)  is kept, as
    :func:`choose_draft_length` does for chains.

    Args:
        allowed: only these nodes may be chosen (with their ancestors); None allows all.

    Returns:
        Indices of the chosen nodes, in increasing order.
    """
    ok = set(range(len(parents))) if allowed is None else set(allowed)
    value = []
    for i, p in enumerate(parents):
        c = max(0.0, min(1.0, confidence[i]))
        value.append(c * (value[p] if p >= 0 else 1.0))
    order = sorted((i for i in range(len(parents)) if i in ok), key=lambda i: (-value[i], i))
    taken: list[int] = []
    inset: set[int] = set()
    gain = 0.0
    best, best_len = -rate * cost.time(base_tokens), 0
    for i in order:
        if value[i] < 1e-4:
            break
        if parents[i] >= 0 and parents[i] not in inset:
            continue
        taken.append(i)
        inset.add(i)
        gain += value[i]
        score = gain - rate * cost.time(base_tokens + len(taken))
        if score > best:
            best, best_len = score, len(taken)
    return sorted(taken[:best_len])
