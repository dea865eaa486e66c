"""How far to trust a drafter: per-request acceptance estimates, calibrated on the request's own outcomes.

A drafter rates each draft token with a bucket (what it knows about the token's reliability: an
n-gram's match length, or a decile of its own probability, and the token's position in the draft);
:class:`AcceptanceCalibration` keeps a Beta posterior of P(accepted | the tokens before it were) per
bucket, and :class:`ShadowScorer` scores every proposal, verified or not, once the committed context
covers it ("shadow evaluation"). The adaptive policy (:mod:`speculative.policy`) weighs these
estimates against the verification cost.

The priors of model drafters (draft models, cross-vocabulary draft models, heads) live here, once:
centred on the bin's raw confidence, worth 2 observations. N-gram priors are the n-gram drafter's
own (:mod:`speculative.drafters.ngram`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

#: draft positions at and beyond this share a calibration bucket
MAX_POS_BUCKET = 3
#: confidence deciles of a model drafter's buckets
N_BINS = 10
#: Beta priors of a model drafter's (confidence bin, position) buckets, centred on the bin's raw
#: confidence (trust the model until the request's own outcomes say otherwise), worth 2 observations
CONFIDENCE_PRIORS = {
    (b, p): (2.0 * (b + 0.5) / N_BINS, 2.0 * (1 - (b + 0.5) / N_BINS))
    for b in range(N_BINS)
    for p in range(MAX_POS_BUCKET + 1)
}


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


def confidence_scorer() -> ShadowScorer:
    """A fresh per-request scorer with the model drafters' priors (:data:`CONFIDENCE_PRIORS`)."""
    return ShadowScorer(AcceptanceCalibration(prior=CONFIDENCE_PRIORS))
