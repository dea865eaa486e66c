"""``speculative check``: a losslessness certificate for a target and a drafter, on the user's machine.

Three parts, each through the engine itself (:class:`~speculative.engine.SpeculativeGenerator`):

1. Greedy identity: each prompt decoded greedily with the drafter (``draft_policy="fixed"``: every
   proposed token is verified) and without (``speculative=False``, the same code). The first
   divergence is reported with both tokens and the target's top-2 logit gap there. On a
   batch-invariant backend (llama.cpp, ``--numerics exact``) every divergence fails; on a
   batch-variant one (``--numerics fast``, transformers) a divergence at a gap below ``tie_gap``
   logits is a near-tie, reported but not failed (rounding can flip plain decoding there too).
2. Verification on real distributions: at positions of the greedy runs the engine prefills, the
   drafter proposes and the target runs its verification forward, giving the target's processed p
   and the drafter's real q (or deterministic draft). The engine's verification function
   (:func:`~speculative.verification.rejection_sample`; ``tree_rejection_sample`` for trees) runs
   ``samples`` times with fresh draws x ~ q; the first emitted token must be distributed as p
   (Leviathan et al. 2023, section 2.3 and appendix A.1). Test: Pearson's chi-square on cells (the
   most likely tokens with expected count >= 5, at most ``max_cells`` - 1, the rest pooled);
   emitting a token with p = 0 fails outright.
3. End to end: ``e2e_tokens``-token sampled continuations of a few contexts (a prompt and the first
   half of its greedy continuation) with and without speculation,
   ``e2e_samples`` disjoint seeds per arm; the marginal of each token after the prefill's and the
   joint of the first two are compared by chi-square tests of homogeneity (cells pooled as above).

Error control: the tests of parts 2 and 3 are one family under Holm's step-down procedure (Holm
1979) at ``alpha``, so a lossless drafter fails any with probability <= alpha (asymptotically);
part 1 is deterministic: a lossless drafter passes with probability >= 1 - alpha. Runs are seeded.

Power: Pearson's statistic on c cells, against an alternative at total-variation distance delta
(on those cells), is asymptotically noncentral chi-square, c - 1 degrees of freedom, noncentrality
lambda >= 4 n delta^2 for one sample of n (Cauchy-Schwarz: sum d^2/p >= (sum |d|)^2) and
>= 4 delta^2 n1 n2 / (n1 + n2) for two samples. Holm rejects every hypothesis with p-value <= alpha/m
(m tests), so a deviation at one position is caught with probability >= P(ncx2 > chi2 quantile at
alpha/m). The report states this at ``tv`` for every test, and the delta caught with probability 0.9.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy import optimize, stats

from .backends.base import ForwardRequest
from .config import DEFAULT_NUM_SPECULATIVE_TOKENS, SamplingParams
from .drafters.base import NoDrafter
from .engine import SpeculativeGenerator
from .errors import ConfigError
from .sampling import Sampler
from .verification import rejection_sample, tree_rejection_sample

#: The built-in prompts (written for this check: short, some repetitive so that n-gram drafting engages).
BUILTIN_PROMPTS = (
    "List the days of the week in order, one per line, then list them again in reverse order.",
    "Write a Python function add(a, b) that returns a + b, then write three assert statements that test it.",
    "Repeat this sentence three times: The cat sat quietly on the warm red mat.",
    "Explain in two sentences why the sky looks blue during the day.",
)

POWER_TARGET = 0.9  # the power at which the detectable deviation is reported


@dataclass(frozen=True)
class CheckConfig:
    """Sizes and levels of a check (the defaults are the CLI's).

    ``k``: most draft tokens per step; ``max_new_tokens``: greedy tokens per prompt; ``tie_gap``: the
    near-tie threshold in logits; ``sampling``: processing of the sampled parts (temperature > 0);
    ``positions`` (0 skips part 2) and ``samples`` (verification runs per position); ``e2e_prompts``
    (0 skips part 3), ``e2e_samples`` (seeds per arm and prompt), ``e2e_tokens``; ``alpha``: the
    family-wise level; ``tv``: the deviation the power is reported at; ``max_cells``: most cells of
    a chi-square test; ``seed``: of every random draw.
    """

    k: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    max_new_tokens: int = 48
    tie_gap: float = 0.05
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=1.0))
    positions: int = 24
    samples: int = 10_000
    e2e_prompts: int = 2
    e2e_samples: int = 300
    e2e_tokens: int = 3
    alpha: float = 0.01
    tv: float = 0.05
    max_cells: int = 32
    seed: int = 0

    def validate(self) -> CheckConfig:
        """Return self, or raise :class:`ConfigError` naming the bad setting."""
        lows = {"k": 1, "max_new_tokens": 2, "positions": 0, "samples": 100, "e2e_prompts": 0, "e2e_samples": 20,
                "e2e_tokens": 3, "max_cells": 2, "seed": 0}
        for name, lo in lows.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name.replace('_', '-')} must be an integer >= {lo}, got {v!r}")
        if self.e2e_samples > 1_000_000 or self.k > 64:
            raise ConfigError("e2e-samples must be <= 1,000,000 and k <= 64")
        for name, lo, hi in (("alpha", 0.0, 0.5), ("tv", 0.0, 1.0)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not lo < v < hi:
                raise ConfigError(f"{name} must be in ({lo:g}, {hi:g}), got {v!r}")
        if not (isinstance(self.tie_gap, (int, float)) and 0 <= self.tie_gap < math.inf):
            raise ConfigError(f"tie-gap must be a finite number >= 0, got {self.tie_gap!r}")
        if self.sampling.validate().temperature <= 0:
            raise ConfigError("the sampled parts of the check need --temperature > 0")
        return self


def load_prompts(path: str | Path) -> list[str]:
    """Prompts from a file: JSON Lines if it ends in .jsonl/.json (a string per line, or an object with
    "prompt" or "turns", whose first turn is used), else plain text, one prompt per line.

    Raises:
        ConfigError: missing or unreadable file, a bad line, no prompts.
    """
    p, out = Path(path), []
    if not p.is_file():
        raise ConfigError(f"--prompts {path}: no such file")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--prompts {path}: cannot read it as UTF-8 text ({type(e).__name__})") from None
    for n, line in ((n, x) for n, x in enumerate(lines, 1) if x.strip()):
        if p.suffix.lower() in (".jsonl", ".json"):
            try:
                line = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"--prompts {path}: line {n} is not JSON") from None
            line = line.get("prompt", (line.get("turns") or [None])[0]) if isinstance(line, dict) else line
            if not isinstance(line, str) or not line.strip():
                raise ConfigError(f"--prompts {path}: line {n} has no prompt text ('prompt' or 'turns')")
        out.append(line)
    if not out:
        raise ConfigError(f"--prompts {path}: the file has no prompts")
    return out


# ---- statistics ---------------------------------------------------------------------------


def holm(pvalues: Sequence[float], alpha: float) -> tuple[list[bool], list[float]]:
    """Holm's step-down procedure (Holm 1979, "A simple sequentially rejective multiple test procedure").

    Returns (rejected at family-wise level ``alpha``, adjusted p-values); the adjusted p-value of the
    r-th smallest (r from 0) is the running maximum of min(1, (m - r) p_(r)).
    """
    m, running = len(pvalues), 0.0
    adj = [1.0] * m
    for r, i in enumerate(np.argsort(np.asarray(pvalues, dtype=np.float64), kind="stable")):
        running = max(running, min(1.0, (m - r) * float(pvalues[i])))
        adj[i] = running
    return [a <= alpha for a in adj], adj


def chi2_power(noncentrality: float, df: int, level: float) -> float:
    """Asymptotic power of a chi-square test with ``df`` degrees of freedom at ``level``."""
    if df < 1:
        return 0.0
    return float(stats.ncx2.sf(stats.chi2.isf(level, df), df, noncentrality))


def detectable_tv(df: int, level: float, n_eff: float, power: float = POWER_TARGET) -> float:
    """Smallest total-variation deviation detected with probability ``power`` (lambda = 4 n_eff delta^2);
    inf when even delta = 1 is not."""
    if df < 1 or n_eff <= 0 or chi2_power(4 * n_eff, df, level) < power:
        return math.inf
    return float(optimize.brentq(lambda d: chi2_power(4 * n_eff * d * d, df, level) - power, 1e-9, 1.0))


def _pool(table: np.ndarray, n_big: int, min_rest: float, rest_row: int) -> np.ndarray:
    """Columns ``[:n_big]`` of ``table`` (rows x outcomes, most important first) and the rest pooled into
    one more column, merged into the last kept one when ``table[rest_row]`` sums below ``min_rest`` there."""
    rest = table[:, n_big:].sum(axis=1)
    out = np.array(table[:, :n_big], dtype=np.float64)
    if rest[rest_row] >= min_rest or not n_big:
        return np.column_stack([out, rest])
    out[:, -1] += rest
    return out


def goodness_of_fit(counts: np.ndarray, p: np.ndarray, max_cells: int) -> dict:
    """Chi-square test of emitted-token counts (int ``[V]``) against p (float ``[V]``).

    Cells: the tokens with expected count >= 5, most likely first, at most ``max_cells`` - 1, and the
    rest pooled (merged into the last cell when its expectation is < 5). Emitting a token with p = 0
    gives p-value 0.
    """
    n = int(counts.sum())
    order = np.argsort(-p, kind="stable")
    table = np.vstack([counts[order], p[order] * n])
    obs, exp = _pool(table, min(int((table[1] >= 5).sum()), max_cells - 1), 5.0, 1)
    impossible = int(counts[p <= 0].sum())
    if impossible or len(obs) < 2:  # one cell: nothing to test
        pvalue = 0.0 if impossible else 1.0
    else:
        pvalue = float(stats.chisquare(obs, exp * (n / exp.sum())).pvalue)
    return {"pvalue": pvalue, "cells": len(obs), "n": n, "impossible_tokens": impossible}


def homogeneity(a: Sequence, b: Sequence, max_cells: int) -> dict:
    """Chi-square test that two samples of hashable outcomes come from one distribution.

    Cells: outcomes seen >= 10 times in both samples together (expected >= 5 per sample for equal
    sizes), most frequent first, at most ``max_cells`` - 1, the rest pooled as in :func:`goodness_of_fit`.
    """
    ca, cb = Counter(a), Counter(b)
    keys = sorted(set(ca) | set(cb), key=lambda x: (-(ca[x] + cb[x]), repr(x)))
    table = np.array([[ca[x] for x in keys], [cb[x] for x in keys], [ca[x] + cb[x] for x in keys]])
    table = _pool(table, min(int((table[2] >= 10).sum()), max_cells - 1), 10, 2)[:2]
    cells = table.shape[1]
    pvalue = 1.0 if cells < 2 else float(stats.chi2_contingency(table, correction=False).pvalue)
    return {"pvalue": pvalue, "cells": cells, "n": [len(a), len(b)]}


# ---- part 1: greedy identity ------------------------------------------------------------


def _next_logits(target, tokens: Sequence[int]) -> np.ndarray:
    """The target's next-token logits after ``tokens`` (float64 ``[V]``), from a fresh prefill."""
    seq = target.allocate_sequence(())
    try:
        target.truncate(seq, 0)
        return np.array(target.forward([ForwardRequest(seq, list(tokens), logits="last")])[0].logits[-1], np.float64)
    finally:
        target.release_sequence(seq, keep_cache=False)


def _sampling_overrides(params: SamplingParams, seed: int | None) -> dict:
    return {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p,
            "seed": seed}


def greedy_part(gen: SpeculativeGenerator, prompts: Sequence[Sequence[int]], cfg: CheckConfig) -> list[dict]:
    """Greedy decoding with and without the drafter; one row per prompt (``plain``: the plain token ids)."""
    t = gen.target
    rows = []
    for i, ids in enumerate(prompts):
        common = dict(max_new_tokens=cfg.max_new_tokens, num_speculative_tokens=cfg.k, draft_policy="fixed",
                      stop=(), logprobs=None, **_sampling_overrides(SamplingParams(), None))
        plain = gen.generate(ids, speculative=False, **common).token_ids
        r = gen.generate(ids, **common)
        row = {"prompt": i, "tokens": len(plain), "draft_tokens": r.stats.draft_tokens,
               "accepted_tokens": r.stats.accepted_tokens, "verdict": "identical", "plain": plain}
        if r.token_ids != plain:
            spec = r.token_ids
            j = next((j for j, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
            tok = {}
            for name, seq in (("plain", plain), ("speculative", spec)):
                tok[name] = {"id": seq[j], "text": t.token_text(seq[j])} if j < len(seq) else None
            gap = None
            if j < min(len(plain), len(spec)):
                top2 = np.sort(_next_logits(t, list(ids) + plain[:j]))[-2:]
                gap = float(top2[1] - top2[0])
            tie = not t.batch_invariant and gap is not None and gap < cfg.tie_gap
            row.update(verdict="near-tie" if tie else "fail", divergence={"index": j, **tok, "top2_gap": gap})
        rows.append(row)
    return rows


# ---- part 2: verification on real distributions -----------------------------------------


@dataclass
class Position:
    """The engine's view at one context: the target's processed p (float64 ``[V]``), the first draft
    token (a chain) or the root's children (a tree), and q (float64 ``[V]``) they were drawn from,
    or None for a deterministic drafter."""

    prompt: int
    offset: int
    p: np.ndarray
    tokens: list[int]
    q: np.ndarray | None
    tree: bool

    def rejection_rate(self) -> float:
        """Chance that verification rejects the first draft token (chains): TV(p, q), or 1 - p(x)."""
        if self.q is None:
            return float(1.0 - self.p[self.tokens[0]])
        return float(1.0 - np.minimum(self.p, self.q).sum())


def probe(gen: SpeculativeGenerator, prompt_ids: Sequence[int], continuation: Sequence[int], offset: int,
          params: SamplingParams, seed: int, prompt_index: int = 0) -> Position | None:
    """Run the engine up to its first verification at context ``prompt_ids + continuation[:offset]``.

    A :class:`~speculative.request.DecodeRequest` prefills ``prompt_ids + continuation[:offset - 1]``
    and emits its next token greedily (``continuation[offset - 1]`` when the continuation is the
    greedy one), then draws its proposal with ``params`` and runs the target's verification forward.
    Returns None when the request ended or the drafter proposed nothing.
    """
    cfg = gen.config.with_(max_new_tokens=3, draft_policy="fixed", speculative=True, stop=(), logprobs=None,
                           **_sampling_overrides(params, seed))
    req = gen.open_request(list(prompt_ids) + list(continuation[: offset - 1]), cfg)
    sampler = req.sampler
    req.sampler = Sampler(replace(cfg.sampling, temperature=0.0), len(req.prompt_ids))
    target = gen.target
    try:
        req.prefill()
        req.sampler = sampler
        if req.done:
            return None
        draft = req.propose()
        prop = draft.proposal
        if req.done or not prop.tokens:
            return None
        pending = len(req.context) - len(target.cached_tokens(req.seq))
        fwd = req.verify_request(draft, req.choose(prop))
        logits = target.forward([fwd])[0].logits
        row = np.array(logits[fwd.output_rows().index(pending - 1)], dtype=np.float32)
        target.truncate(req.seq, len(req.context))
        if sampler.uses_history:
            row = sampler.adjust(row[None], req.context, ())[0]
        p = sampler.probs(row)
        first = [0] if prop.parents is None else [i for i, par in enumerate(prop.parents) if par < 0]
        q = None if prop.probs is None else np.asarray(prop.probs[first[0]], dtype=np.float64)
        return Position(prompt_index, offset, p, [int(prop.tokens[i]) for i in first], q, prop.parents is not None)
    finally:
        req.release()


def collect_positions(gen, prompts, continuations, cfg: CheckConfig) -> list[Position]:
    """Up to ``cfg.positions`` positions spread over the greedy continuations: an equal share per prompt,
    offsets in a low-discrepancy order, skipping those where the drafter proposes nothing (then a second
    pass fills the shortfall from any prompt); one prompt at a time, so that prefills reuse its prefix."""
    golden = (math.sqrt(5) - 1) / 2
    orders = [sorted(range(1, len(c) + 1), key=lambda j: (j * golden) % 1.0) for c in continuations]
    out: list[Position] = []
    budget = 4 * cfg.positions  # probes at most
    for rnd in range(2):
        for i, order in enumerate(orders):
            want = cfg.positions - len(out) if rnd else cfg.positions // len(orders) + (i < cfg.positions % len(orders))
            found = 0
            while order and found < want and len(out) < cfg.positions and budget > 0:
                budget -= 1
                pos = probe(gen, prompts[i], continuations[i], order.pop(0), cfg.sampling, cfg.seed + budget, i)
                if pos is not None:
                    out.append(pos)
                    found += 1
    return out


Verifier = Callable[..., object]


def emitted_counts(pos: Position, n: int, rng: np.random.Generator, verifier: Verifier = rejection_sample,
                   tree_verifier: Verifier = tree_rejection_sample) -> np.ndarray:
    """Counts (int64 ``[V]``) of the first token emitted by ``n`` runs of the verification step.

    Each run draws fresh draft tokens x ~ q (i.i.d. siblings for a tree) when q is given, else
    keeps the deterministic draft. Only the first emitted token is counted, so the target's p at
    later positions (the bonus token's) is a one-token stub.
    """
    p, q = pos.p, pos.q
    counts = np.zeros(p.shape[0], dtype=np.int64)
    stub = np.ones(1)
    width = len(pos.tokens)
    draws = None
    if q is not None:
        cdf = np.cumsum(q)
        draws = np.minimum(np.searchsorted(cdf, rng.random((n, width)) * cdf[-1], side="right"), p.shape[0] - 1)
    if not pos.tree:
        probs = lambda i: p if i == 0 else stub  # noqa: E731
        qs = None if q is None else q[None]
        for t in range(n):
            x = pos.tokens[0] if draws is None else int(draws[t, 0])
            res = verifier(probs, [x], qs, rng)
            counts[x if res.num_accepted else res.next_token] += 1
        return counts
    parents = [-1] * width
    probs = lambda u: p if u < 0 else stub  # noqa: E731
    child = None if q is None else (lambda u: q if u < 0 else None)
    for t in range(n):
        toks = pos.tokens if draws is None else [int(x) for x in draws[t]]
        res = tree_verifier(probs, toks, parents, child, rng)
        counts[toks[res.path[0]] if res.path else res.next_token] += 1
    return counts


def sampling_part(positions: Sequence[Position], cfg: CheckConfig, verifier: Verifier = rejection_sample,
                  tree_verifier: Verifier = tree_rejection_sample) -> list[dict]:
    """One goodness-of-fit test per position (see the module docstring)."""
    rng = np.random.default_rng([cfg.seed, 2])
    rows = []
    for pos in positions:
        counts = emitted_counts(pos, cfg.samples, rng, verifier, tree_verifier)
        test = goodness_of_fit(counts, pos.p, cfg.max_cells)
        rows.append({"part": "sampling", "prompt": pos.prompt, "offset": pos.offset, "draft": pos.tokens,
                     "draft_distribution": "deterministic" if pos.q is None else "sampled", "tree": pos.tree,
                     "rejection_rate": pos.rejection_rate() if not pos.tree else None,
                     "n_eff": float(cfg.samples), **test})
    return rows


# ---- part 3: end to end ---------------------------------------------------------------------


def e2e_part(gen: SpeculativeGenerator, prompts: Sequence[Sequence[int]], cfg: CheckConfig) -> tuple[list[dict], int]:
    """Two-sample tests of short sampled continuations; returns (tests, draft tokens verified)."""
    rows, drafted = [], 0
    T, n = cfg.e2e_tokens, cfg.e2e_samples
    for i, ids in enumerate(prompts[: cfg.e2e_prompts]):
        arms = []
        for arm in (False, True):
            outs = []
            for s in range(n):
                seed = cfg.seed * 10**7 + 2 * (i * n + s) + int(arm)
                r = gen.generate(ids, max_new_tokens=T, num_speculative_tokens=cfg.k, draft_policy="fixed",
                                 speculative=arm, stop=(), logprobs=None, **_sampling_overrides(cfg.sampling, seed))
                outs.append(tuple(r.token_ids) + (None,) * (T - len(r.token_ids)))  # None: ended
                drafted += r.stats.draft_tokens if arm else 0
            arms.append(outs)
        plain, spec = arms
        what = [(f"token {j + 1}", lambda o, j=j: o[j]) for j in range(1, T)] + [("tokens 1-2", lambda o: o[:2])]
        for label, key in what:
            test = homogeneity([key(o) for o in plain], [key(o) for o in spec], cfg.max_cells)
            rows.append({"part": "e2e", "prompt": i, "what": label, "n_eff": n * n / (2 * n), **test})
    return rows, drafted


# ---- the whole check --------------------------------------------------------------------------


def run_check(gen: SpeculativeGenerator, prompts: Sequence[str] | None = None, cfg: CheckConfig | None = None, *,
              verifier: Verifier = rejection_sample, tree_verifier: Verifier = tree_rejection_sample,
              progress: Callable[[str], None] | None = None) -> dict:
    """Run the three parts; returns the report (JSON-serializable; ``passed`` is the verdict).
    ``verifier`` / ``tree_verifier`` replace the engine's functions in part 2 (tests pass wrong ones).

    Raises:
        ConfigError: bad settings, the drafter ``none``, an empty prompt or one too long.
    """
    cfg = (cfg or CheckConfig()).validate()
    say = progress or (lambda s: None)
    if isinstance(gen.drafter, NoDrafter):
        raise ConfigError("the drafter is 'none' (plain decoding): there is nothing to check; pass --drafter")
    texts = list(prompts) if prompts is not None else list(BUILTIN_PROMPTS)
    ids = [gen.encode_prompt(t) for t in texts]
    for x in ids:
        gen.target.check_prompt_fits(len(x))
    say(f"greedy identity: {len(ids)} prompts x {cfg.max_new_tokens} tokens")
    greedy = greedy_part(gen, ids, cfg)
    say(f"verification on real distributions: {cfg.positions} positions x {cfg.samples:,} runs")
    plains = [g.pop("plain") for g in greedy]
    positions = collect_positions(gen, ids, plains, cfg) if cfg.positions else []
    sampling = sampling_part(positions, cfg, verifier, tree_verifier)
    n_e2e = min(cfg.e2e_prompts, len(ids))
    say(f"end to end: {n_e2e} prompts x {cfg.e2e_samples} seeds x 2 arms")
    # contexts: prompt + the first half of its greedy continuation (mid-text, where drafters have history)
    e2e, drafted = e2e_part(gen, [ids[i] + plains[i][: len(plains[i]) // 2] for i in range(n_e2e)], cfg)
    family = sampling + e2e
    rejected, adjusted = holm([t["pvalue"] for t in family], cfg.alpha)
    level = cfg.alpha / max(1, len(family))
    for t, rej, adj in zip(family, rejected, adjusted):
        df = t["cells"] - 1
        tv90 = detectable_tv(df, level, t["n_eff"])
        t.update(adjusted_pvalue=adj, rejected=rej, power_at_tv=chi2_power(4 * t["n_eff"] * cfg.tv**2, df, level),
                 detectable_tv=tv90 if math.isfinite(tv90) else None)
    g_drafted = sum(g["draft_tokens"] for g in greedy)
    parts = {
        "greedy": {"passed": g_drafted > 0 and all(g["verdict"] != "fail" for g in greedy), "prompts": greedy,
                   **({} if g_drafted else {"reason": "the drafter proposed no draft token"})},
        "sampling": _summary(sampling, cfg.positions > 0, "the drafter proposed no draft token at any tested position"),
        "e2e": _summary(e2e, n_e2e > 0, "no draft token was verified in the speculative runs", drafted == 0),
    }
    parts["e2e"]["draft_tokens_verified"] = drafted
    parts["sampling"]["positions_wanted"] = cfg.positions
    t = gen.target
    return {
        "target": t.model_id, "backend": t.name, "batch_invariant": bool(t.batch_invariant),
        "drafter": gen.drafter.description, "prompts": len(ids), "builtin_prompts": prompts is None,
        "config": {**asdict(cfg), "sampling": {k: v for k, v in asdict(cfg.sampling).items() if v is not None}},
        "tests": len(family), "holm_level": cfg.alpha, "pass_probability_if_lossless": 1 - cfg.alpha,
        "parts": parts, "passed": all(p["passed"] for p in parts.values()),
    }


def _summary(tests: list[dict], enabled: bool, empty_reason: str, unexercised: bool = False) -> dict:
    if not enabled:
        return {"passed": True, "skipped": True, "tests": []}
    if not tests or unexercised:
        return {"passed": False, "reason": empty_reason, "tests": tests}
    return {"passed": not any(t["rejected"] for t in tests), "tests": tests}
