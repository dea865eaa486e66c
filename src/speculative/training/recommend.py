"""Held-out evaluation of a trained drafter, and what its ``drafter.json`` recommends for inference.

After training (:mod:`speculative.training.train`), the head is evaluated on the development prompts
(``src/speculative/data/devset.jsonl``: greedy, k draft tokens, fixed policy) and two settings are chosen by
an estimated decoding rate, new tokens over (steps x the verification time per step pooled over the
evaluations + the drafting time): the precision it drafts in (:func:`pick_inference_precision`) and how
much of its draft vocabulary it uses (:func:`pick_draft_vocab`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch-free at import; no import circle with train.py
    from ..drafters.head_nets import HeadConfig
    from .config import TrainConfig

#: the smallest draft vocabulary that ``inference_vocab="auto"`` tries (it tries half and a quarter of the trained
#: one, each only if at least this)
MIN_AUTO_DRAFT_VOCAB = 1024


def check_inference_vocab(value: str | int, method: str, draft_vocab: int, name: str = "inference_vocab"
                          ) -> int | None:
    """Validate an ``inference_vocab`` setting (called ``name`` in the messages): "auto", "all", or a number of
    tokens (an int or a string of digits) from 1 to ``draft_vocab``. Returns the number, or None for "auto" and
    "all".

    Raises:
        ValueError: another value; or a setting other than "auto" for a drafter that is not an EAGLE head (only
            EAGLE heads' drafters use part of their draft vocabulary, ``heads.EagleDrafter``).
    """
    if method != "eagle" and value != "auto":
        raise ValueError(f"{name} {value!r}: the setting is for EAGLE heads ({method} drafters always use all of "
                         "their vocabulary)")
    if value in ("auto", "all"):
        return None
    digits = isinstance(value, str) and value.isascii() and value.isdigit()
    if (digits or (isinstance(value, int) and not isinstance(value, bool))) and 1 <= int(value) <= draft_vocab:
        return int(value)
    raise ValueError(f"{name} must be 'auto', 'all' or a number of tokens from 1 to the trained draft vocabulary "
                     f"({draft_vocab}), got {value!r}")


def pick_inference_precision(evals: dict[str, dict]) -> tuple[str, dict[str, float]]:
    """Choose between held-out evaluations of one head at several precisions (same prompts, same k, fixed
    policy): the one with the highest estimated decoding rate new_tokens / (steps * v + draft_time_s).

    v is the target's verification time per step pooled over all the runs: the target does the same work in
    each, so pooling keeps the machine's noise in v out of the comparison, and what differs is what the
    precision changes, the drafting time and the accepted tokens (int8 quantizes the activations per call,
    which can change the head's top-1; on heads with large activation outliers it often does). Ties go to the
    first entry of ``evals``.

    Args:
        evals: precision -> :func:`evaluate_drafter`'s result (``new_tokens``, ``steps``,
            ``verify_time_s``, ``draft_time_s``).
    Returns:
        (the chosen precision, {precision: estimated tokens/s, ..., "verify_ms_per_step": v in ms}).
    Raises:
        ValueError: ``evals`` is empty.
    """
    rate, info = _estimated_rates(evals)
    return max(rate, key=rate.get), info  # max keeps the first of equal rates


def _estimated_rates(evals: dict) -> tuple[dict, dict[str, float]]:
    """{key: new_tokens / (steps * v + draft_time_s)}, with v the verification time per step (s) pooled over
    ``evals`` (see :func:`pick_inference_precision`), and the same as a record: {"<key>_tokens_per_s": ...,
    "verify_ms_per_step": v in ms}. Raises ValueError when ``evals`` is empty."""
    if not evals:
        raise ValueError("no evaluations to choose from")
    steps = sum(e["steps"] for e in evals.values())
    v = sum(e["verify_time_s"] for e in evals.values()) / max(1, steps)
    rate = {key: e["new_tokens"] / max(1e-9, e["steps"] * v + e["draft_time_s"]) for key, e in evals.items()}
    return rate, {**{f"{key}_tokens_per_s": r for key, r in rate.items()}, "verify_ms_per_step": 1e3 * v}


def _recommend(drafter_dir: Path, hcfg: HeadConfig, setting: str, choice, how: str, rates: dict, evals: dict,
               **fields) -> dict:
    """Record ``choice`` as the head's recommended ``setting`` (``hcfg.extra[setting]``, drafter.json rewritten
    atomically); returns the record of the choice for metrics.json: the choice, ``fields``, how it was made, the
    estimated rates and each evaluated setting's held-out figures."""
    from ..cache import atomic_path
    from ..drafters.head_nets import CONFIG_FILE

    hcfg.extra = {**hcfg.extra, setting: choice}
    with atomic_path(drafter_dir / CONFIG_FILE) as tmp:
        tmp.write_text(hcfg.to_json())
    keys = ("mean_accepted_tokens", "acceptance_rate", "draft_ms_per_token", "verify_ms_per_step")
    return {"choice": choice, **fields, "how": how, **rates,
            "heldout": {str(k): {key: e[key] for key in keys} for k, e in evals.items()}}


def pick_draft_vocab(evals: dict[int, dict]) -> tuple[int, dict[str, float]]:
    """Choose how much of a head's draft vocabulary to use, from held-out evaluations of the head truncated to
    several sizes (its ``vocab_ids`` list the tokens most frequent first; same prompts, precision, k and fixed
    policy; the first entry is the whole trained vocabulary): among the sizes whose τ is at least the whole
    vocabulary's, the one with the highest estimated decoding rate (:func:`pick_inference_precision`'s estimate,
    v pooled over ``evals``); ties go to the earlier (larger) size.

    A smaller draft vocabulary costs nothing in losslessness (tokens outside it are never proposed) and reads
    fewer LM-head rows per draft token (FR-Spec, Zhao et al. 2025, section 3), but the tokens it drops are the
    rare ones, identifiers in code above all. The development prompts are few, so a size that loses any accepted
    draft on them is not chosen, however much faster it drafts.

    Args:
        evals: draft-vocabulary size -> :func:`evaluate_drafter`'s result, the whole vocabulary first.
    Returns:
        (the chosen size, {"<size>_tokens_per_s": estimated tokens/s, ..., "verify_ms_per_step": v in ms}).
    Raises:
        ValueError: ``evals`` is empty.
    """
    rate, info = _estimated_rates(evals)
    tau_all = next(iter(evals.values()))["mean_accepted_tokens"]
    eligible = {n: r for n, r in rate.items() if evals[n]["mean_accepted_tokens"] >= tau_all}
    return max(eligible, key=eligible.get), info  # max keeps the first of equal rates


def recommend_draft_vocab(target: str, drafter_dir: Path, hcfg: HeadConfig, cfg: TrainConfig, precision: str,
                          heldout: dict) -> tuple[dict, dict | None]:
    """Choose the draft vocabulary an EAGLE head's drafter.json recommends (``extra.draft_vocab``, which the
    drafter follows unless its spec says ``vocab=``) and rewrite drafter.json atomically.

    With ``cfg.inference_vocab`` "auto" the head is evaluated at ``precision`` with its whole vocabulary again
    (``heldout``, the precision's evaluation, may carry the process's first-run costs, which would favour the
    smaller sizes on a tie in tau) and with half and a quarter of ``cfg.draft_vocab`` (each if at least
    :data:`MIN_AUTO_DRAFT_VOCAB`), and :func:`pick_draft_vocab` chooses; where no smaller size qualifies, the whole
    vocabulary is recorded with ``heldout``. A given number is evaluated and recorded (all of the vocabulary if it
    is larger than the head's); "all" records the whole vocabulary with ``heldout``. Medusa heads record nothing.

    Returns:
        (the held-out evaluation of the recommended settings, a record of the choice for metrics.json, or None
        for Medusa heads).
    Raises:
        ValueError: an invalid ``cfg.inference_vocab`` (:func:`check_inference_vocab`).
        ConfigError, ModelNotFoundError: the target or the head cannot be loaded (from :func:`evaluate_drafter`).
    """
    if cfg.method != "eagle":
        return heldout, None
    whole = len(hcfg.vocab_ids)  # --draft-vocab's tokens, plus end-of-generation ids it lacked
    given = check_inference_vocab(cfg.inference_vocab, cfg.method, cfg.draft_vocab)

    def evaluate(n: int) -> dict:
        return evaluate_drafter(target, drafter_dir, cfg.method, n_prompts=cfg.eval_prompts, precision=precision,
                                vocab=n)

    rates: dict = {}
    sizes = [n for n in (min(cfg.draft_vocab, whole) // 2, min(cfg.draft_vocab, whole) // 4)
             if n >= MIN_AUTO_DRAFT_VOCAB]
    if cfg.inference_vocab == "auto" and sizes:
        evals = {whole: evaluate(whole)}
        evals.update({n: evaluate(n) for n in sizes})
        choice, rates = pick_draft_vocab(evals)
        how = ("measured: the highest estimated decoding rate on the development prompts among the sizes whose "
               "tau is the whole vocabulary's or more")
    elif given is not None and given < whole:
        choice, evals, how = given, {given: evaluate(given)}, "as given by --inference-vocab"
    else:
        choice, evals = whole, {whole: heldout}
        how = {"auto": f"the whole vocabulary: --draft-vocab {cfg.draft_vocab} leaves no smaller size of at least "
                       f"{MIN_AUTO_DRAFT_VOCAB} to try",
               "all": "all of it, as given by --inference-vocab"}.get(
                   cfg.inference_vocab,
                   f"all of it, as given by --inference-vocab {given} (the head has {whole} tokens)")
    return evals[choice], _recommend(drafter_dir, hcfg, "draft_vocab", choice, how, rates, evals, whole=whole)


def recommend_inference_precision(target: str, drafter_dir: Path, hcfg: HeadConfig, cfg: TrainConfig
                                  ) -> tuple[str, dict, dict]:
    """Evaluate a freshly saved head and write its recommended inference precision into its drafter.json
    (``extra.inference_precision``, which the drafter follows unless its spec says ``precision=``).

    With ``cfg.inference_precision`` "auto" an EAGLE head is evaluated in int8 and then in fp32 (so that the
    process's first-run costs fall on int8, and a doubt on fp32) and the faster by
    :func:`pick_inference_precision` is recommended (fp32, the first on a tie; fp32 alone where PyTorch has no
    x86 quantized engine); a given precision is recorded as given. Medusa heads are recorded fp32 (their
    LM-head products stay fp32). ``hcfg.extra`` is updated in place and drafter.json rewritten atomically.

    Returns:
        (the recommended precision, its held-out evaluation, a record of the choice for metrics.json).
    Raises:
        ConfigError, ModelNotFoundError: the target or the head cannot be loaded (from :func:`evaluate_drafter`).
    """
    from ..drafters.heads import int8_available

    wanted = cfg.inference_precision
    if cfg.method != "eagle":
        candidates, how = ["fp32"], "Medusa heads run fp32"
    elif wanted != "auto":
        candidates, how = [wanted], "as given by --inference-precision"
    elif not int8_available():
        candidates, how = ["fp32"], "fp32: this PyTorch has no quantized CPU engine"
    else:
        candidates, how = ["fp32", "int8"], "measured: the higher estimated decoding rate on the development prompts"
    done = {p: evaluate_drafter(target, drafter_dir, cfg.method, n_prompts=cfg.eval_prompts,
                                precision=p if cfg.method == "eagle" else None) for p in reversed(candidates)}
    evals = {p: done[p] for p in candidates}  # fp32 first: it wins a tie
    choice, rates = pick_inference_precision(evals)
    return choice, evals[choice], _recommend(drafter_dir, hcfg, "inference_precision", choice, how, rates, evals)


def evaluate_drafter(target: str, drafter_dir: Path, method: str, k: int = 4, max_new_tokens: int = 64,
                     tree: int = 0, n_prompts: int | None = None, precision: str | None = None,
                     vocab: int | None = None) -> dict:
    """Greedy mean accepted tokens per step (k draft tokens, fixed policy) on the development prompts, overall and
    per category (``by_category``: tau and acceptance by position of each category's prompts), with the time
    spent drafting and verifying. ``precision`` (int8 or fp32; heads only) and ``vocab`` (the draft vocabulary's
    most frequent tokens to use; EAGLE heads only) override what the head's drafter.json recommends."""
    from ..bench.datasets import load_questions
    from ..engine import SpeculativeGenerator
    from ..stats import GenerationStats

    spec = (f"{method}:{drafter_dir}" + (f",tree={tree}" if tree else "")
            + (f",precision={precision}" if precision else "") + (f",vocab={vocab}" if vocab else ""))
    gen = SpeculativeGenerator.from_pretrained(target, drafter=spec, n_ctx=2048)
    try:
        total, per_cat, count = GenerationStats(), {}, {}
        for q in load_questions("dev")[:n_prompts]:
            r = gen.generate(q.turns[0], max_new_tokens=max_new_tokens, num_speculative_tokens=k, draft_policy="fixed")
            total.merge(r.stats)
            per_cat.setdefault(q.category, GenerationStats()).merge(r.stats)
            count[q.category] = count.get(q.category, 0) + 1
        draft_steps = sum(total.accept_counts)
        by_category = {c: {"prompts": count[c], "new_tokens": st.new_tokens, "steps": st.steps,
                           "mean_accepted_tokens": st.mean_accepted_tokens,
                           "per_position_acceptance": st.per_position_acceptance} for c, st in sorted(per_cat.items())}
        return {
            "prompts": "dev",
            "k": k,
            "new_tokens": total.new_tokens,
            "steps": total.steps,
            "mean_accepted_tokens": total.mean_accepted_tokens,
            "mean_accepted_tokens_per_draft_step": (total.accepted_tokens + draft_steps) / max(1, draft_steps),
            "acceptance_rate": total.acceptance_rate,
            "per_position_acceptance": total.per_position_acceptance,
            "draft_ms_per_token": 1e3 * total.draft_time_s / max(1, total.draft_tokens),
            "verify_ms_per_step": 1e3 * total.verify_time_s / max(1, total.steps),
            "draft_time_s": total.draft_time_s,
            "verify_time_s": total.verify_time_s,
            "by_category": by_category,
        }
    finally:
        gen.close()
