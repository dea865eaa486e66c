"""A draft model with another tokenizer than the target's, lossless under greedy decoding and sampling.

``--drafter model:NAME`` compares the two vocabularies token string by token string
(and the BOS and end-of-generation ids); when they differ, this drafter bridges them.
Two mechanisms, chosen per request (``vocab=auto``, the default) or forced
(``model:NAME,vocab=text|intersect``):

Text bridge (greedy requests). The draft model runs on its own tokens: its own
rendering of the prompt (its own chat template applied to the same messages when the
engine knows them, else the target prompt's text, special tokens written out and
re-parsed by the drafter's tokenizer), then tokens covering the target's output text.
It drafts greedily in its own vocabulary; the draft's text is re-tokenized by the
target's tokenizer after a look-behind window of committed target tokens, so that
token boundaries line up with the committed context (a target token straddling the
boundary means the window is dropped). A trailing target token that more draft text
could still extend (``" hel"`` of ``" hello"``) is dropped, and so is a trailing
incomplete UTF-8 character. The proposal is deterministic: q is one-hot, so greedy
verification gives exactly plain greedy output. (Under sampling a one-hot draft x is
accepted with probability p(x), exactly as an n-gram draft: also lossless, which is
what ``vocab=text`` does for sampled requests.)

Token-level intersection, TLI (sampled requests; Timor et al. 2025, "Accelerating LLM
Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies", ICML 2025, the TLI method). The drafter drafts only tokens whose byte
strings exist in both vocabularies (a one-to-one map; special tokens only where both
have one with the same text), from its processed distribution restricted to them and
renormalized (logits outside the intersection set to -inf before the request's
temperature / top-k / top-p). Mapped to target ids, that distribution is q (zero
elsewhere), and modified rejection sampling with it keeps the output distributed
exactly as the target's.

What each costs in acceptance: the text bridge proposes what the drafter would write,
in the target's own tokenization, but pays for the dropped trailing token (about one
drafter token per step) and under sampling accepts x only with probability p(x)
rather than min(1, p(x)/q(x)). TLI keeps the full min(1, p/q) acceptance, but can never
propose a target token outside the intersection, and its drafted tokens follow the
drafter's segmentation, not the target's (a drafter token that the target would split
or merge is rejected).

The drafter's KV cache is never recomputed from scratch: at each proposal its tokens
are compared, by their bytes, with the target's committed output text; the cache is
rolled back to the longest prefix of its tokens that the text still covers (less a
look-behind of a few tokens, re-tokenized with the new text so that boundaries match
the drafter's own tokenization), and only the new text is fed. The prompt is
prefilled lazily, by the first proposal. When the drafter's own context window would
overflow, it stops drafting for the rest of the request (plain decoding, still lossless).

Errors: :class:`~speculative.errors.VocabularyMismatchError` at bind time for pairs
that cannot be bridged (a tokenizer that does not reproduce text byte for byte, and
vocabularies that share too few tokens for TLI), each naming the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Backend, ForwardRequest, common_prefix_len
from ..errors import ConfigError, VocabularyMismatchError
from ..sampling import sample_from
from .base import DraftProposal, DraftState, ModelDrafter
from .calibration import ShadowScorer, confidence_bucket, confidence_scorer
from .token_bridge import (
    Intersection,
    TokenTable,
    build_intersection,
    is_char_start,
    retokenize,
    utf8_complete_len,
    vocab_label,
)

#: ``vocab=`` values of ``model:NAME``
VOCAB_MODES = ("auto", "same", "text", "intersect")
#: committed tokens re-tokenized with new text, so that token boundaries line up
LOOKBEHIND = 4
#: fewest shared tokens for which the token-level intersection is offered
MIN_INTERSECTION = 256

def _softmax_at(row: np.ndarray, idx: int) -> float:
    """Softmax probability of ``row[idx]`` (-inf entries allowed)."""
    m = np.max(row)
    return float(np.exp(row[idx] - m) / np.sum(np.exp(row - m, dtype=np.float32), dtype=np.float64))


# ---- the drafter ---------------------------------------------------------------------------------


@dataclass
class CrossVocabState(DraftState):
    """Per request: the drafter's sequence and the byte view of the target's output.

    The drafter's sequence is ``dprompt + dtoks``; ``dcum[j]`` is the byte length of
    ``dtoks[:j]`` and ``covered`` how many of ``dtoks`` the target's output bytes
    ``tbytes`` (``tcum`` per output token) are known to contain.
    """

    seq_id: int = 0
    dprompt: list[int] = field(default_factory=list)
    dtoks: list[int] = field(default_factory=list)
    dcum: list[int] = field(default_factory=lambda: [0])
    covered: int = 0
    tbytes: bytearray = field(default_factory=bytearray)
    tcum: list[int] = field(default_factory=lambda: [0])
    n_out: int = 0
    disabled: bool = False
    scorer: ShadowScorer = field(default_factory=ShadowScorer)


class CrossVocabDrafter(ModelDrafter):
    """``model:NAME`` whose tokenizer differs from the target's (see the module docstring).

    Args:
        model: the loaded draft :class:`~speculative.backends.base.Backend`.
        mode: "auto" (text bridge for greedy requests, TLI for sampled ones), "text" or "intersect".

    Raises:
        ConfigError: an unknown mode.
        VocabularyMismatchError: at :meth:`bind`, a pair that cannot be bridged in ``mode``.
    """

    kind = "model"

    def __init__(self, model: Backend, mode: str = "auto"):
        if mode not in ("auto", "text", "intersect"):
            raise ConfigError(f"vocab={mode} is not a cross-vocabulary mode (auto, text or intersect)")
        super().__init__(model)
        self.mode = mode
        self.ttab: TokenTable | None = None
        self.dtab: TokenTable | None = None
        self.inter: Intersection | None = None
        self.text_ok = False

    @property
    def description(self) -> str:
        return f"model:{self.model.model_id},vocab={self.mode}"

    def bind(self, target: Backend) -> None:
        self.ttab, self.dtab = TokenTable(target), TokenTable(self.model)
        why_t, why_d = self.ttab.round_trips(), self.dtab.round_trips()
        self.text_ok = why_t is None and why_d is None
        inter = build_intersection(self.ttab, self.dtab)
        self.inter = inter if inter.size >= MIN_INTERSECTION else None
        pair = f"draft model {vocab_label(self.model)} and target {vocab_label(target)}"
        no_text = (f"their tokenizers do not reproduce text byte for byte ({why_t or why_d}: "
                   f"{'target' if why_t else 'draft'})")
        no_inter = f"they share only {inter.size:,} token strings (at least {MIN_INTERSECTION} are needed)"
        if self.mode == "text" and not self.text_ok:
            raise VocabularyMismatchError(f"cannot bridge {pair} through text: {no_text}")
        if self.mode == "intersect" and self.inter is None:
            raise VocabularyMismatchError(f"cannot bridge {pair} by token intersection: {no_inter}")
        if self.mode == "auto" and not self.text_ok and self.inter is None:
            raise VocabularyMismatchError(f"cannot bridge {pair}: {no_text}, and {no_inter}")
        super().bind(target)

    def _mode_for(self, greedy: bool) -> str:
        if self.mode != "auto":
            return self.mode
        if greedy:
            return "text" if self.text_ok else "intersect"
        return "intersect" if self.inter is not None else "text"

    # ---- requests -----------------------------------------------------------------------------------

    def start(self, prompt: Sequence[int], messages: Sequence[dict] | None = None, tenant: str = "") -> CrossVocabState:
        """The drafter's own prompt: its chat template on ``messages`` when both are there, else the
        target prompt's text (control tokens written out, a leading BOS left out) re-tokenized by the
        drafter (with its BOS where it wants one). Prefilled lazily, by the first proposal."""
        m = self.model
        if messages and m.chat_template:
            try:
                dprompt = list(m.apply_chat_template(list(messages)))
            except Exception:  # noqa: BLE001 - a template that rejects the messages: fall back to the text
                dprompt = m.encode(self.ttab.render(prompt))
        else:
            dprompt = m.encode(self.ttab.render(prompt))
        return CrossVocabState(
            prompt_len=len(prompt),
            seq_id=m.allocate_sequence(dprompt),
            dprompt=dprompt,
            scorer=confidence_scorer(self.calibrations.get(tenant)),
        )

    def _absorb(self, st: CrossVocabState, context: Sequence[int]) -> None:
        """Append the target's newly committed output tokens to its byte view."""
        pieces = self.ttab.pieces
        for t in context[st.prompt_len + st.n_out :]:
            st.tbytes += pieces[t] or b""
            st.tcum.append(len(st.tbytes))
        st.n_out = len(context) - st.prompt_len

    def _set_dtoks(self, st: CrossVocabState, keep: int, new: Sequence[int]) -> None:
        pieces = self.dtab.pieces
        del st.dtoks[keep:]
        del st.dcum[keep + 1 :]
        for t in new:
            st.dtoks.append(int(t))
            st.dcum.append(st.dcum[-1] + len(pieces[t] or b""))
        st.covered = min(st.covered, keep)

    def _sync(self, st: CrossVocabState) -> None:
        """Make ``dtoks`` cover exactly the target's complete output text (see the module docstring)."""
        B = st.tbytes
        valid = utf8_complete_len(B)
        pieces = self.dtab.pieces
        j = st.covered
        while j < len(st.dtoks):
            p = pieces[st.dtoks[j]]
            a, b = st.dcum[j], st.dcum[j + 1]
            if p is None or b > valid or B[a:b] != p:
                break
            j += 1
        st.covered = j
        if st.dcum[j] == valid:
            self._set_dtoks(st, j, ())  # drop the rejected rest of the last draft
            return
        j0 = max(0, j - LOOKBEHIND)
        while j0 > 0 and not is_char_start(B, st.dcum[j0]):
            j0 -= 1
        new = self.dtab.encode(bytes(B[st.dcum[j0] : valid]).decode("utf-8", "replace"))
        cp = common_prefix_len(st.dtoks[j0:], new)
        self._set_dtoks(st, j0 + cp, new[cp:])
        st.covered = j0 + cp
        k = st.covered
        while k < len(st.dtoks) and st.dcum[k + 1] <= valid and B[st.dcum[k] : st.dcum[k + 1]] == pieces[st.dtoks[k]]:
            k += 1
        st.covered = k

    def _lookbehind(self, st: CrossVocabState) -> bytes:
        """Bytes of the last committed output tokens (up to LOOKBEHIND), from a character boundary."""
        i = max(0, st.n_out - LOOKBEHIND)
        while i > 0 and not is_char_start(st.tbytes, st.tcum[i]):
            i -= 1
        return bytes(st.tbytes[st.tcum[i] :])

    def catchup_tokens(self, state: CrossVocabState, context: Sequence[int]) -> int:
        # the drafter's own prompt not yet in its cache (its output tokens follow the target's, a few a step)
        cached = self.model.cached_tokens(state.seq_id)
        if len(cached) >= len(state.dprompt):
            return 0
        return len(state.dprompt) - common_prefix_len(cached, state.dprompt)

    def limit_context(self, state: CrossVocabState, context: Sequence[int], n_tokens: int) -> None:
        keep = max(1, int(n_tokens) - len(state.dtoks))
        state.dprompt = state.dprompt[-keep:]

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0, guide=None) -> DraftProposal:
        """Bring the drafter up to the committed context, then draft (text bridge or TLI, per request).
        Not steerable: ``guide`` is ignored (the request cuts the draft at the constraint's first refusal)."""
        st: CrossVocabState = state
        m = self.model
        st.scorer.score(context)
        if st.disabled:
            return DraftProposal()
        self._absorb(st, context)
        mode = self._mode_for(sampler.greedy)
        if mode == "intersect" and utf8_complete_len(st.tbytes) < len(st.tbytes):
            return DraftProposal()  # the target stopped inside a character: TLI drafts whole tokens only
        self._sync(st)
        budget = max_tokens if mode == "intersect" else 2 * max_tokens + 2  # drafter tokens
        full = st.dprompt + st.dtoks
        if not full:
            return DraftProposal()  # nothing to condition on (an empty rendering of the prompt)
        if len(full) + budget + 1 > m.n_ctx:
            st.disabled = True  # the drafter's window is full: plain decoding from here on
            return DraftProposal()
        kept = m.reuse_prefix(st.seq_id, full, keep_last=1)
        pending = full[kept:]
        catchup_s, caught_up = 0.0, 0
        if len(pending) > 1:  # the prompt (lazy prefill) or the new text
            pending, catchup_s, caught_up = self._catch_up(st.seq_id, pending)
        if mode == "intersect":
            p = self._draft_intersect(st, pending, max_tokens, sampler, rng, min_confidence)
        else:
            p = self._draft_text(st, pending, max_tokens, budget, min_confidence)
        p.catchup_s, p.catchup_tokens = catchup_s, caught_up
        return p

    def _draft_text(self, st: CrossVocabState, pending, max_tokens: int, budget: int, min_conf: float) -> DraftProposal:
        m, dp, cal = self.model, self.dtab.pieces, st.scorer.calibration
        valid = utf8_complete_len(st.tbytes)
        tail = bytes(st.tbytes[valid:])  # an incomplete character the target emitted: the draft must complete it
        left = self._lookbehind(st)
        drafted: list[int] = []
        dconf: list[float] = []
        dend: list[int] = []  # end of each drafted token in ``text`` (bytes after the complete context)
        text = bytearray()
        ids: list[int] = []
        conf: list[float] = []
        buckets: list[tuple] = []
        special: int | None = None
        for _ in range(budget):
            row = m.forward([ForwardRequest(st.seq_id, pending, logits="last")])[0].logits[-1]
            tok = int(np.argmax(row))
            drafted.append(tok)
            dconf.append(_softmax_at(row, tok))
            pending = [tok]
            piece = dp[tok]
            if piece is None:  # a control token (its end of turn): the draft text is final
                special = self.inter.d2t[tok] if self.inter is not None else -1
                special = int(special) if special >= 0 else None
                dend.append(len(text))
                final = True
            else:
                text += piece
                dend.append(len(text))
                final = False
            if not text.startswith(tail) and not tail.startswith(text):
                break  # the draft does not complete the target's last character
            new = bytes(text[len(tail) :])
            ids = retokenize(self.ttab, left, new, final=final) if len(text) >= len(tail) else []
            if final and special is not None and self.ttab.bytes_of(ids) == new:
                ids = ids + [special]
            ids = ids[:max_tokens]
            conf, buckets = self._target_confidence(ids, new, dconf, dend, len(tail), cal)
            cum = float(np.prod(conf)) if conf else 1.0
            if final or len(ids) >= max_tokens or (conf and not cal.worth_drafting(cum, len(ids), min_conf)):
                break
        # the drafted tokens extend the drafter's sequence (the last one is not fed yet)
        self._set_dtoks(st, len(st.dtoks), drafted)
        st.scorer.record(len(st.tcum) - 1 + st.prompt_len, ids, buckets)
        return DraftProposal(tokens=ids, probs=None, confidence=conf)

    def _target_confidence(self, ids, new: bytes, dconf, dend, skip: int, cal):
        """Per target token: the product of the drafter's probabilities of the drafted tokens that
        overlap its bytes (a control token: its own probability), mapped through the drafter's
        calibration (the request's tenant's) by (bin, position)."""
        conf, buckets = [], []
        starts = [0] + dend[:-1]
        pos = skip  # target tokens' bytes start after the completed character, in the draft text
        for j, t in enumerate(ids):
            piece = self.ttab.pieces[t]
            if piece is None:  # the final control token: the last drafted token
                raw = dconf[-1]
            else:
                end = pos + len(piece)
                raw = 1.0
                for s, e, c in zip(starts, dend, dconf):
                    if s < end and e > pos:
                        raw *= c
                pos = end
            b = confidence_bucket(raw, j)
            buckets.append(b)
            conf.append(cal.estimate(b))
        return conf, buckets

    def _draft_intersect(self, st: CrossVocabState, pending, max_tokens: int, sampler, rng, min_conf: float) -> DraftProposal:
        m, inter, cal = self.model, self.inter, st.scorer.calibration
        eog = self.target.eos_token_ids
        vt = self.target.vocab_size
        neg = np.float32(-np.inf)
        drafted: list[int] = []
        ids: list[int] = []
        probs: list[np.ndarray] = []
        conf: list[float] = []
        buckets: list[tuple] = []
        cum = 1.0
        for i in range(max_tokens):
            row = m.forward([ForwardRequest(st.seq_id, pending, logits="last")])[0].logits[-1]
            masked = np.where(inter.mask, row, neg)
            if sampler.greedy:
                tok = int(np.argmax(masked))
                raw = _softmax_at(masked, tok)
            else:
                qd = sampler.probs(masked)
                tok = sample_from(qd, rng)
                raw = float(qd[tok])
                q = np.zeros(vt, dtype=np.float64)
                q[inter.target_ids] = qd[inter.draft_ids]
                probs.append(q)
            t = int(inter.d2t[tok])
            drafted.append(tok)
            ids.append(t)
            b = confidence_bucket(raw, i)
            c = cal.estimate(b)
            buckets.append(b)
            conf.append(c)
            pending = [tok]
            cum *= c
            if t in eog or (i + 1 < max_tokens and not cal.worth_drafting(cum, i + 1, min_conf)):
                break
        self._set_dtoks(st, len(st.dtoks), drafted)
        st.scorer.record(len(st.tcum) - 1 + st.prompt_len, ids, buckets)
        return DraftProposal(tokens=ids, probs=np.stack(probs) if probs else None, confidence=conf)
