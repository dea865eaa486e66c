"""The decoding loop: one loop for every backend and drafter.

Each step (Leviathan et al. 2023, algorithm 1):
  1. the drafter proposes m <= k tokens after the committed context;
  2. the target scores the last committed token and the m draft tokens in one
     forward pass (m+1 rows of logits);
  3. verification accepts a prefix of the draft and draws one more token (the
     residual sample, or the bonus token when all m are accepted);
  4. the target's cache is rolled back to the accepted prefix (the drafter syncs
     its own cache on its next proposal).

Invariant: the target's cache holds every committed token but the last, which
the next verification pass feeds. Output ends right after the first
end-of-generation token and never exceeds ``max_new_tokens``, however many
tokens a step accepts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from .backends.base import Backend, ForwardRequest
from .config import GenerationConfig
from .cost_model import CostModel, cached_verify_cost, choose_draft_length
from .drafters.base import DraftProposal, Drafter, NoDrafter
from .errors import ConfigError
from .sampling import Sampler
from .stats import GenerationStats
from .verification import rejection_sample, verify_greedy

Prompt = str | Sequence[int] | Sequence[dict]


@dataclass
class GenerationResult:
    """What one generation produced.

    Attributes:
        text: the generated text (end-of-generation tokens not rendered).
        token_ids: the generated token ids only (an ending EOS included).
        finish_reason: "stop" (an end-of-generation token) or "length" (max_new_tokens
            or the context window).
        stats: :class:`~speculative.stats.GenerationStats`.
        prompt_token_ids: the prompt as the target saw it.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats
    prompt_token_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }


class TextStream:
    """Incremental detokenization: text pieces whose concatenation is the decoded text.

    Holds back text while the newest tokens end in an incomplete UTF-8 character
    (decoded as U+FFFD). Decodes a sliding window of ids, so the cost per token is
    constant (the offsets method of Hugging Face's text-generation-inference).
    """

    def __init__(self, backend: Backend):
        self.backend = backend
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self.text = ""

    def push(self, new_ids: Sequence[int]) -> str:
        self.ids.extend(new_ids)
        dec = self.backend.decode
        prefix_text = dec(self.ids[self._prefix : self._read])
        new_text = dec(self.ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """Text held back at the end (an incomplete character becomes U+FFFD)."""
        dec = self.backend.decode
        prefix_text = dec(self.ids[self._prefix : self._read])
        new_text = dec(self.ids[self._prefix :])
        delta = new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
        self._prefix = self._read = len(self.ids)
        self.text += delta
        return delta


class Generation:
    """A running generation. Iterate it for text pieces, or :meth:`blocks` for the
    token ids each step emitted; ``result`` is set once it ends.

    Closing it early (``close()``, or dropping it) frees the target's sequence.
    """

    def __init__(self, steps: Iterator[list[int]], backend: Backend, holder: dict):
        self._steps = steps
        self._stream = TextStream(backend)
        self._holder = holder
        self.result: GenerationResult | None = None

    def blocks(self) -> Iterator[list[int]]:
        """Token ids emitted by each step (1..k+1 per step, cut at EOS / max_new_tokens)."""
        for new in self._steps:
            self._stream.push(new)
            yield new
        self._finish()

    def __iter__(self) -> Iterator[str]:
        for new in self._steps:
            piece = self._stream.push(new)
            if piece:
                yield piece
        tail = self._finish()
        if tail:
            yield tail

    def _finish(self) -> str:
        tail = self._stream.flush()
        h = self._holder
        self.result = GenerationResult(
            text=self._stream.text,
            token_ids=h["out"],
            finish_reason=h["finish_reason"],
            stats=h["stats"],
            prompt_token_ids=h["prompt"],
        )
        return tail

    def close(self) -> None:
        self._steps.close()


class SpeculativeGenerator:
    """Lossless speculative decoding of ``target`` with ``drafter``.

    Args:
        target: the target model's backend.
        drafter: a :class:`~speculative.drafters.base.Drafter`; None means plain decoding.
        config: default :class:`~speculative.config.GenerationConfig`; per-call overrides allowed.

    Example::

        from speculative import SpeculativeGenerator
        gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram")
        print(gen.generate("What is speculative decoding?", max_new_tokens=64).text)
    """

    def __init__(
        self,
        target: Backend,
        drafter: Drafter | None = None,
        config: GenerationConfig | None = None,
        cost_model: CostModel | None = None,
    ):
        self.target = target
        self.drafter = drafter or NoDrafter()
        if self.drafter.target is not target:
            self.drafter.bind(target)
        self.config = (config or GenerationConfig()).validate()
        self._cost_model = cost_model

    @property
    def cost_model(self) -> CostModel:
        """The target's verification cost T(n): cached per machine and model, measured once (~1 s) if missing."""
        if self._cost_model is None:
            self._cost_model = cached_verify_cost(self.target)
        return self._cost_model

    @classmethod
    def from_pretrained(
        cls,
        target: str = "smollm2-135m-instruct",
        drafter: str = "ngram",
        backend: str = "llama.cpp",
        *,
        n_ctx: int | None = 4096,
        n_threads: int | None = None,
        numerics: str = "exact",
        device: str | None = None,
        dtype: str | None = None,
        max_sequences: int = 1,
        config: GenerationConfig | None = None,
    ) -> SpeculativeGenerator:
        """Load target and drafter from specs (registered names, paths, HF ids; see ``--drafter``)."""
        from .backends import load_backend
        from .drafters import BuildContext, build_drafter

        t = load_backend(
            target, backend, n_ctx=n_ctx, n_threads=n_threads, max_sequences=max_sequences,
            numerics=numerics, device=device, dtype=dtype,
        )
        try:
            ctx = BuildContext(
                backend=backend, n_threads=n_threads, numerics=numerics, device=device, dtype=dtype,
                n_ctx=n_ctx, max_sequences=max_sequences,
            )
            d = build_drafter(drafter, t, ctx)
        except BaseException:
            t.close()
            raise
        return cls(t, d, config)

    # ---- prompts ----------------------------------------------------------------

    def encode_prompt(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids of a prompt: text (chat template applied when ``chat``), messages, or ids.

        ``chat=None`` applies the template when the model has one.

        Raises:
            ConfigError: empty prompt, or chat asked for without a template.
        """
        t = self.target
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ConfigError("the prompt is empty")
            use_chat = (t.chat_template is not None) if chat is None else chat
            if use_chat:
                return t.apply_chat_template([{"role": "user", "content": prompt}])
            return t.encode(prompt)
        items = list(prompt)
        if not items:
            raise ConfigError("the prompt is empty")
        if isinstance(items[0], dict):
            return t.apply_chat_template(items)
        return [int(x) for x in items]

    # ---- generation ---------------------------------------------------------------

    def generate(self, prompt: Prompt, *, chat: bool | None = None, **overrides) -> GenerationResult:
        """Generate to the end; ``overrides`` are :class:`GenerationConfig` fields
        (``max_new_tokens``, ``num_speculative_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``).
        """
        g = self.stream(prompt, chat=chat, **overrides)
        for _ in g:
            pass
        assert g.result is not None
        return g.result

    def stream(self, prompt: Prompt, *, chat: bool | None = None, **overrides) -> Generation:
        """Like :meth:`generate`, as an iterator of text pieces; ``.result`` is set at the end.

        Validation errors are raised here, before the first piece.
        """
        cfg = self.config.with_(**overrides).validate() if overrides else self.config
        ids = self.encode_prompt(prompt, chat)
        self.target.check_prompt_fits(len(ids))
        holder: dict = {"prompt": ids}
        return Generation(self._steps(ids, cfg, holder), self.target, holder)

    def make_sampler(self, cfg: GenerationConfig) -> Sampler:
        return Sampler(cfg.sampling)

    def _steps(self, prompt_ids: list[int], cfg: GenerationConfig, holder: dict) -> Iterator[list[int]]:
        target, drafter = self.target, self.drafter
        sampler = self.make_sampler(cfg)
        rng = np.random.default_rng(cfg.sampling.seed)
        k = cfg.num_speculative_tokens
        eos = target.eos_token_ids if cfg.stop_at_eos else frozenset()
        max_new = cfg.max_new_tokens
        stats = GenerationStats(num_speculative_tokens=k, prompt_tokens=len(prompt_ids))
        out: list[int] = []
        holder.update(out=out, stats=stats, finish_reason="length")
        perf = time.perf_counter
        plain = isinstance(drafter, NoDrafter)
        cost = self.cost_model if (cfg.draft_policy == "adaptive" and not plain) else None
        draft_cost_per_token = 0.0  # seconds, running mean of the drafter's cost

        t0 = perf()
        seq = target.allocate_sequence(prompt_ids)
        dstate = None
        try:
            kept = target.reuse_prefix(seq, prompt_ids, keep_last=1)
            logits = target.forward([ForwardRequest(seq, prompt_ids[kept:], logits="last")])[0].logits
            dstate = drafter.start(prompt_ids)
            context = list(prompt_ids)
            row = sampler.adjust(logits[-1:], context, ())[0] if sampler.uses_history else logits[-1]
            first, _ = sampler.sample(row, rng)
            stats.steps = 1
            stats.prefill_time_s = perf() - t0
            context.append(first)
            out.append(first)
            stats.new_tokens = 1
            stats.wall_time_s = perf() - t0
            done = first in eos or len(out) >= max_new
            if first in eos:
                holder["finish_reason"] = "stop"
            yield [first]

            while not done:
                room = target.n_ctx - len(context)  # draft tokens that still fit after the last committed one
                if room < 0:
                    break  # context window full: finish_reason "length"
                m_max = min(k, max_new - len(out) - 1, room)
                rate = min_conf = 0.0
                if cost is not None:
                    # long-run tokens/s: at least plain decoding's; what a draft token must beat
                    t1 = cost.time(1)
                    decode_s = stats.wall_time_s - stats.prefill_time_s
                    rate = max(1.0 / t1, (len(out) - 1) / decode_s if decode_s > 0 else 0.0)
                    min_conf = rate * ((cost.time(k + 1) - t1) / k + draft_cost_per_token)
                td = perf()
                proposal = (
                    drafter.propose(dstate, context, m_max, sampler, rng, min_confidence=min_conf)
                    if m_max > 0
                    else DraftProposal()
                )
                draft = [int(t) for t in proposal.tokens[:m_max]]
                if cost is not None and proposal.confidence is not None and draft:
                    draft = draft[: choose_draft_length(proposal.confidence[: len(draft)], cost, rate)]
                tv = perf()
                stats.draft_time_s += tv - td
                if proposal.tokens:
                    n_prop = min(len(proposal.tokens), m_max)
                    draft_cost_per_token += 0.1 * ((tv - td) / n_prop - draft_cost_per_token)

                logits = target.forward([ForwardRequest(seq, [context[-1]] + draft, logits="all")])[0].logits
                if cost is not None:
                    cost.update(len(draft) + 1, perf() - tv)
                if sampler.uses_history:
                    logits = sampler.adjust(logits, context, draft)
                if sampler.greedy:
                    res = verify_greedy(sampler.argmax(logits), draft)
                else:
                    q = proposal.probs[: len(draft)] if proposal.probs is not None else None
                    res = rejection_sample(lambda i: sampler.probs(logits[i]), draft, q, rng)
                target.truncate(seq, len(context) + res.num_accepted)
                stats.record_step(len(draft), res.num_accepted)

                new: list[int] = []
                for t in draft[: res.num_accepted] + [res.next_token]:
                    new.append(t)
                    if t in eos:
                        holder["finish_reason"] = "stop"
                        done = True
                        break
                    if len(out) + len(new) >= max_new:
                        done = True
                        break
                context.extend(new)
                out.extend(new)
                now = perf()
                stats.verify_time_s += now - tv
                stats.new_tokens = len(out)
                stats.wall_time_s = now - t0
                yield new
        finally:
            stats.wall_time_s = perf() - t0
            if dstate is not None:
                drafter.finish(dstate)
            target.release_sequence(seq)

    def reset_caches(self) -> None:
        """Empty every KV cache of target and drafter (no prefix reuse into the next generation)."""
        for s in range(self.target.max_sequences):
            self.target.truncate(s, 0)
        self.drafter.reset_caches()

    def close(self) -> None:
        """Free drafter and target."""
        self.drafter.close()
        self.target.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
