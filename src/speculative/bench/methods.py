"""What the bench runs: our decoders (baseline included) and the peers, behind one small interface.

Every method runs one :class:`~speculative.bench.datasets.Question` (all its
turns) from the same prompt token ids and returns a :class:`RunRecord`. Multi-
turn questions append the method's own answer and the next user turn through
the model's chat template, as Spec-Bench does; a model without a template gets
the turns as plain text separated by blank lines.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..backends.base import Backend
from ..config import GenerationConfig
from ..engine import SpeculativeGenerator
from ..stats import GenerationStats
from .datasets import Question


@dataclass
class RunRecord:
    """One method on one question (all turns).

    Attributes:
        turn_token_ids: generated ids per turn.
        texts: generated text per turn.
        new_tokens: generated tokens over all turns.
        wall_time_s: generation time over all turns, prefill included.
        prefill_time_s: time to the first generated token of each turn, summed.
        stats: the engine's merged :class:`GenerationStats` (our methods), else None.
        extra: a peer's own figures (llama-server: ``draft_n``, ``draft_n_accepted``,
            ``rss_peak_mb`` of the server process).
    """

    turn_token_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    new_tokens: int = 0
    wall_time_s: float = 0.0
    prefill_time_s: float = 0.0
    stats: GenerationStats | None = None
    extra: dict = field(default_factory=dict)

    @property
    def decode_time_s(self) -> float:
        return max(self.wall_time_s - self.prefill_time_s, 1e-9)


class Method:
    """A decoder under test. ``kind`` is "baseline", "ours" or "peer"; peers are not gated on greedy identity.
    ``plain``: plain decoding of the target (the report's headline compares with the fastest of these)."""

    label: str = "method"
    kind: str = "ours"
    k: int | None = None
    compare_by: str = "ids"  # or "text" (endpoints)
    plain: bool = False

    def run(self, question: Question, cfg: GenerationConfig) -> RunRecord:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _chat_messages(turns: Sequence[str], answers: Sequence[str]) -> list[dict]:
    msgs: list[dict] = []
    for i, t in enumerate(turns):
        msgs.append({"role": "user", "content": t})
        if i < len(answers):
            msgs.append({"role": "assistant", "content": answers[i]})
    return msgs


def chat_prompt(target: Backend, turns: Sequence[str], answers: Sequence[str], chat: bool) -> list[int]:
    """Prompt ids for the next turn, given earlier turns and the method's own answers."""
    if chat:
        msgs: list[dict] = []
        for i, t in enumerate(turns):
            msgs.append({"role": "user", "content": t})
            if i < len(answers):
                msgs.append({"role": "assistant", "content": answers[i]})
        return target.apply_chat_template(msgs)
    text = ""
    for i, t in enumerate(turns):
        text += ("\n\n" if text else "") + t
        if i < len(answers):
            text += "\n\n" + answers[i]
    return target.encode(text)


class EngineMethod(Method):
    """Our engine with one drafter (``none``: the baseline)."""

    def __init__(self, label: str, generator: SpeculativeGenerator, kind: str, k: int | None, policy: str, chat: bool,
                 tenant: str = ""):
        self.label = label
        self.gen = generator
        self.kind = kind
        self.plain = kind == "baseline"
        self.k = k
        self.policy = policy
        self.chat = chat
        #: the tenant its requests run as: methods that share one drafter (``--sweep-k``) each run as their own,
        #: so that none drafts from, or is calibrated or silenced by, another's requests
        self.tenant = tenant

    def run(self, question: Question, cfg: GenerationConfig) -> RunRecord:
        cfg = cfg.with_(num_speculative_tokens=self.k or cfg.num_speculative_tokens, draft_policy=self.policy,
                        tenant=self.tenant)
        self.gen.reset_caches()  # every run starts cold; turns of one question share the cache
        rec = RunRecord(stats=GenerationStats(num_speculative_tokens=cfg.num_speculative_tokens))
        for i in range(len(question.turns)):
            ids = chat_prompt(self.gen.target, question.turns[: i + 1], rec.texts, self.chat)
            # chat: the messages themselves (the engine renders the same ids; a drafter with another
            # tokenizer renders them with its own template)
            msgs = _chat_messages(question.turns[: i + 1], rec.texts) if self.chat else None
            r = self.gen.generate(msgs or ids, **_overrides(cfg))
            rec.turn_token_ids.append(list(r.token_ids))
            rec.texts.append(r.text)
            rec.new_tokens += len(r.token_ids)
            rec.wall_time_s += r.stats.wall_time_s
            rec.prefill_time_s += r.stats.prefill_time_s
            rec.stats.merge(r.stats)
        return rec

    def close(self) -> None:
        if self.kind != "baseline":
            self.gen.drafter.close()


def _overrides(cfg: GenerationConfig) -> dict:
    s = cfg.sampling
    return dict(
        max_new_tokens=cfg.max_new_tokens,
        num_speculative_tokens=cfg.num_speculative_tokens,
        draft_policy=cfg.draft_policy,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        seed=s.seed,
        tenant=cfg.tenant,
    )


class _TimedTurns:
    """Shared turn loop of the peers: prompt ids from our target's template, timing per turn.

    ``generate_turn(ids)`` returns (token ids or None, time of the first token or None,
    text or None, token count when ids are unknown).
    """

    def __init__(self, target: Backend, chat: bool):
        self.target = target
        self.chat = chat

    def run_turns(self, question: Question, generate_turn) -> RunRecord:
        rec = RunRecord()
        for i in range(len(question.turns)):
            ids = chat_prompt(self.target, question.turns[: i + 1], rec.texts, self.chat)
            t0 = time.perf_counter()
            toks, first_at, text, n_tokens = generate_turn(ids)
            t1 = time.perf_counter()
            if text is None:
                text = self.target.decode(toks)
            rec.turn_token_ids.append(list(toks or []))
            rec.texts.append(text)
            rec.new_tokens += len(toks) if toks is not None else int(n_tokens or 0)
            rec.wall_time_s += t1 - t0
            rec.prefill_time_s += (first_at - t0) if first_at else (t1 - t0)
        return rec
