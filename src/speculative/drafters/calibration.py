"""How far to trust a drafter: acceptance estimates, calibrated on the drafter's own outcomes.

A drafter rates each draft token with a bucket (what it knows about the token's reliability: an
n-gram's match length, or a decile of its own probability, and the token's position in the draft);
:class:`AcceptanceCalibration` keeps a Beta posterior of P(accepted | the tokens before it were) per
bucket, and :class:`ShadowScorer` scores every proposal, verified or not, once the committed context
covers it ("shadow evaluation"). The adaptive policy (:mod:`speculative.policy`) weighs these
estimates against the verification cost.

A model drafter (draft model, cross-vocabulary draft model, head) keeps one calibration per tenant
across requests (:class:`TenantCalibrations`; each request scores into it through its own
:class:`ShadowScorer`, :func:`confidence_scorer`): how well a network's probability predicts acceptance
is a property of the network, and a request of 100 tokens fills few of its 40 buckets. Its priors live
here, once: centred on the bin's raw confidence, worth 2 observations; a bucket forgets beyond
:data:`MEMORY_WEIGHT` observations, so a workload that changes is followed. An n-gram drafter's buckets
(match lengths) depend on the text at hand, so its calibration stays per request, with its own priors
(:mod:`speculative.drafters.ngram`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

#: draft positions at and beyond this share a calibration bucket
MAX_POS_BUCKET = 3
#: confidence deciles of a model drafter's buckets
N_BINS = 10
#: Beta priors of a model drafter's (confidence bin, position) buckets, centred on the bin's raw
#: confidence (trust the model until the outcomes of its tenant's requests say otherwise), worth 2 observations
CONFIDENCE_PRIORS = {
    (b, p): (2.0 * (b + 0.5) / N_BINS, 2.0 * (1 - (b + 0.5) / N_BINS))
    for b in range(N_BINS)
    for p in range(MAX_POS_BUCKET + 1)
}
#: the most observations a bucket of a model drafter's calibration weighs (older ones are forgotten in
#: proportion): about the last 10–20 requests of 100 tokens at the first draft positions
MEMORY_WEIGHT = 100.0
#: the factor by which a calibration's per-position tallies (:meth:`AcceptanceCalibration.reach_rate`) fade at
#: each request's start: about the last 10 requests count
REACH_DECAY = 0.9
#: most tenants whose calibration a model drafter keeps (the least recently used goes first)
MAX_TENANTS = 10_000


def confidence_bucket(confidence: float, position: int) -> tuple[int, int]:
    """The calibration bucket of a model drafter's token: (decile of its raw probability in [0, 1],
    draft position capped at :data:`MAX_POS_BUCKET`)."""
    return (min(int(confidence * N_BINS), N_BINS - 1), min(position, MAX_POS_BUCKET))


@dataclass
class AcceptanceCalibration:
    """Online estimates of P(draft token accepted | the ones before it were), per bucket.

    A bucket is whatever the drafter knows about a token's reliability (an
    n-gram match length, a confidence decile) and its position in the draft.
    Beta(prior_a, prior_b) prior per bucket; counts from observed outcomes.
    """

    prior: dict[tuple, tuple[float, float]] = field(default_factory=dict)
    default_prior: tuple[float, float] = (1.0, 1.0)
    counts: dict[tuple, list[float]] = field(default_factory=dict)
    #: the most observations a bucket weighs (None: no limit); beyond, its counts are scaled down so
    #: that the newest observations count in full and the old ones fade
    max_weight: float | None = None
    #: accepted and observed draft tokens per draft position (capped at MAX_POS_BUCKET), for reach_rate
    reach: dict[int, list[float]] = field(default_factory=dict)
    #: estimates are the posterior mean minus this many posterior standard
    #: deviations: pessimistic while evidence is thin, since a rejected draft
    #: token costs more than an accepted one saves on compute-bound hardware
    #: (0.5 chosen on the development prompts, between 0, 0.5 and 1)
    caution: float = 0.5

    def estimate(self, bucket: tuple) -> float:
        a, b = self.prior.get(bucket, self.default_prior)
        s, n = self.counts.get(bucket, (0.0, 0.0))
        a, b = a + s, b + n - s
        mean = a / (a + b)
        if not self.caution:
            return mean
        sd = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))
        return max(0.0, mean - self.caution * sd)

    def observe(self, bucket: tuple, accepted: bool) -> None:
        c = self.counts.setdefault(bucket, [0.0, 0.0])
        c[0] += 1.0 if accepted else 0.0
        c[1] += 1.0
        if self.max_weight is not None and c[1] > self.max_weight:
            c[0] *= self.max_weight / c[1]
            c[1] = self.max_weight
        if bucket and isinstance(bucket[-1], int):  # the position's own tally, for reach_rate (uncapped: a sum
            r = self.reach.setdefault(min(bucket[-1], MAX_POS_BUCKET), [0.0, 0.0])  # of capped buckets is skewed)
            r[0] += 1.0 if accepted else 0.0
            r[1] += 1.0

    def begin_request(self) -> None:
        """A request starts: the positions' tallies (:meth:`reach_rate`) fade by :data:`REACH_DECAY`.

        A position below the drafting bar is never drafted, so never observed again; fading, its estimate
        returns to the prior (0.5) within a few dozen requests and the position is tried again."""
        for r in self.reach.values():
            r[0] *= REACH_DECAY
            r[1] *= REACH_DECAY

    def reach_rate(self, position: int) -> float:
        """Mean acceptance of the draft tokens observed at ``position`` (capped at :data:`MAX_POS_BUCKET`;
        a bucket's last element), whatever else their buckets say, given the tokens before them were
        accepted: (1 + accepted) / (2 + observed) over the tallies of :meth:`observe` (faded per request,
        :meth:`begin_request`), 0.5 before any observation.

        What drafting one more token is worth before it is drafted: a drafter that reached cumulative
        confidence ``cum`` expects ``cum * reach_rate(next position)`` more tokens from it."""
        s, n = self.reach.get(min(position, MAX_POS_BUCKET), (0.0, 0.0))
        return (1.0 + s) / (2.0 + n)

    def worth_drafting(self, cum: float, position: int, min_confidence: float) -> bool:
        """Whether a drafter that pays per draft token should draft the token at ``position`` (0-based),
        its draft so far accepted whole with probability ``cum``: the tokens it is expected to add,
        ``cum * reach_rate(position)``, at least ``min_confidence`` (what one more draft token costs,
        in tokens; 0 under the fixed policy: always)."""
        return min_confidence <= 0.0 or cum * self.reach_rate(position) >= min_confidence


@dataclass
class ShadowScorer:
    """Scores proposals against the tokens later committed, verified or not.

    Each recorded proposal carries a calibration bucket per token; once the
    committed context covers a token, the outcome (equal or not, given all
    earlier tokens of the proposal were) is folded into ``calibration``.
    Under sampling, P(committed == x) = p(x), the acceptance probability of a
    deterministic draft, so the estimates stay unbiased.
    """

    calibration: AcceptanceCalibration = field(default_factory=AcceptanceCalibration)
    pending: list[list] = field(default_factory=list)  # [start, tokens, buckets, scored]

    def record(self, start: int, tokens: Sequence[int], buckets: Sequence[tuple]) -> None:
        if tokens:
            self.pending.append([start, list(tokens), list(buckets), 0])

    def score(self, context: Sequence[int]) -> None:
        cal = self.calibration
        keep = []
        for item in self.pending:
            start, toks, buckets, done = item
            resolved = False
            while done < len(toks) and start + done < len(context):
                ok = context[start + done] == toks[done]
                cal.observe(buckets[done], ok)
                done += 1
                if not ok:
                    resolved = True
                    break
            if not resolved and done < len(toks):
                item[3] = done
                keep.append(item)
        self.pending = keep

    def reset(self) -> None:
        self.pending = []


def confidence_calibration() -> AcceptanceCalibration:
    """A model drafter's calibration, kept across requests: the model drafters' priors
    (:data:`CONFIDENCE_PRIORS`), each bucket weighing at most :data:`MEMORY_WEIGHT` observations."""
    return AcceptanceCalibration(prior=CONFIDENCE_PRIORS, max_weight=MEMORY_WEIGHT)


class TenantCalibrations:
    """A model drafter's calibrations, one per tenant (the server's API key or ``user`` field; "" for the
    CLI and library), so that a tenant's acceptance estimates come from its own requests alone (as its draft
    policy does: :meth:`~speculative.engine.SpeculativeGenerator.policy_for`); the least recently used beyond
    :data:`MAX_TENANTS` is forgotten."""

    def __init__(self) -> None:
        self._by_tenant: OrderedDict[str, AcceptanceCalibration] = OrderedDict()

    def get(self, tenant: str = "") -> AcceptanceCalibration:
        cal = self._by_tenant.pop(tenant, None) or confidence_calibration()
        self._by_tenant[tenant] = cal
        while len(self._by_tenant) > MAX_TENANTS:
            self._by_tenant.popitem(last=False)
        return cal


def confidence_scorer(calibration: AcceptanceCalibration | None = None) -> ShadowScorer:
    """A request's scorer that folds its outcomes into ``calibration`` (the drafter's own for the request's
    tenant, kept across requests; None: a fresh one, :func:`confidence_calibration`), whose per-position
    tallies fade once per request (:meth:`AcceptanceCalibration.begin_request`)."""
    cal = calibration if calibration is not None else confidence_calibration()
    cal.begin_request()
    return ShadowScorer(cal)
