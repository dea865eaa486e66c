"""The one statistics object of a generation, shared by CLI, bench and server."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    """Counters and timings of one generation.

    Counting conventions (Spec-Bench's):
      * ``steps`` counts target forward passes that emitted tokens, the prefill
        (which emits the first token) included, so ``mean_accepted_tokens`` =
        ``new_tokens / steps`` is exactly 1.0 for plain decoding.
      * ``draft_tokens`` / ``accepted_tokens`` count proposed / accepted draft
        tokens; ``acceptance_rate`` is their ratio (alpha, per token).
      * ``accept_counts[j]``: steps with at least one draft token that accepted
        exactly j of them, j = 0..k.
      * ``position_proposed[i]`` / ``position_accepted[i]``: steps whose draft had
        an (i+1)-th token / accepted it; their ratio is per-position acceptance.

    ``cached_prompt_tokens``: prompt tokens whose keys/values were reused from an
    earlier request's cache (a shared prefix, e.g. the earlier turns of a chat).

    ``drafter_steps``: for a drafter that combines several (``suffix+OTHER``), how many steps each
    of them proposed the draft (by drafter name); empty otherwise.

    Times are wall-clock seconds. ``prefill_time_s`` covers the prompt's
    forward pass in target and drafter; ``draft_time_s`` the drafter's proposing;
    ``verify_time_s`` the target's verification passes and the acceptance test.
    ``target_forward_time_s`` / ``draft_forward_time_s`` are the time inside the target's
    and the drafter's model forward passes (in a server batch, the target's whole batched
    pass); the rest of the wall time, :attr:`overhead_time_s`, is orchestration: Python,
    sampling, verification, tokenization.
    """

    num_speculative_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accept_counts: list[int] = field(default_factory=list)
    position_proposed: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    wall_time_s: float = 0.0
    target_forward_time_s: float = 0.0
    draft_forward_time_s: float = 0.0
    drafter_steps: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if not self.accept_counts:
            self.accept_counts = [0] * (k + 1)
        if not self.position_proposed:
            self.position_proposed = [0] * k
        if not self.position_accepted:
            self.position_accepted = [0] * k

    def record_step(self, proposed: int, accepted: int) -> None:
        """Count one verification step that proposed ``proposed`` and accepted ``accepted`` draft tokens."""
        self.steps += 1
        if proposed <= 0:
            return
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        while len(self.accept_counts) <= proposed:  # k may grow between requests of a server
            self.accept_counts.append(0)
            self.position_proposed.append(0)
            self.position_accepted.append(0)
        self.accept_counts[accepted] += 1
        for i in range(proposed):
            self.position_proposed[i] += 1
        for i in range(accepted):
            self.position_accepted[i] += 1

    def record_tree_step(self, n_nodes: int, depth: int, accepted: int) -> None:
        """Count one step that verified a tree of ``n_nodes`` draft tokens, ``depth`` deep, and accepted
        a path of ``accepted`` of them (per-position counters use depths)."""
        self.record_step(depth, accepted)
        if depth > 0:
            self.draft_tokens += n_nodes - depth

    def merge(self, other: GenerationStats) -> GenerationStats:
        """Add another generation's counters and times to this one (turns of a chat, a server's totals)."""
        for name in ("prompt_tokens", "cached_prompt_tokens", "new_tokens", "steps", "draft_tokens", "accepted_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("prefill_time_s", "draft_time_s", "verify_time_s", "wall_time_s", "target_forward_time_s",
                     "draft_forward_time_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("accept_counts", "position_proposed", "position_accepted"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if len(mine) < len(theirs):
                mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v
        for name, n in other.drafter_steps.items():
            self.drafter_steps[name] = self.drafter_steps.get(name, 0) + n
        self.num_speculative_tokens = max(self.num_speculative_tokens, other.num_speculative_tokens)
        return self

    @classmethod
    def from_dict(cls, d: dict) -> GenerationStats:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float | None]:
        """Fraction of steps with an i-th draft token that accepted it (None where never proposed)."""
        return [a / p if p else None for a, p in zip(self.position_accepted, self.position_proposed)]

    @property
    def decode_time_s(self) -> float:
        return max(self.wall_time_s - self.prefill_time_s, 0.0)

    @property
    def overhead_time_s(self) -> float:
        """Wall time outside the target's and the drafter's forward passes (orchestration)."""
        return max(self.wall_time_s - self.target_forward_time_s - self.draft_forward_time_s, 0.0)

    @property
    def overhead_fraction(self) -> float:
        """Orchestration's share of the wall time (0 when nothing was timed)."""
        return self.overhead_time_s / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of wall time, prefill included."""
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """New tokens per second of decoding, prefill excluded."""
        return self.new_tokens / self.decode_time_s if self.decode_time_s > 0 else 0.0

    def to_dict(self) -> dict:
        """JSON-ready dict: the counters, the times and the derived rates."""
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_tokens=self.mean_accepted_tokens,
            per_position_acceptance=self.per_position_acceptance,
            tokens_per_second=self.tokens_per_second,
            decode_tokens_per_second=self.decode_tokens_per_second,
            overhead_time_s=self.overhead_time_s,
            overhead_fraction=self.overhead_fraction,
        )
        return d

    def summary(self) -> str:
        """One line: new tokens, tok/s, steps, acceptance rate, mean accepted tokens per step."""
        return (
            f"{self.new_tokens} new tokens in {self.wall_time_s:.2f} s: {self.tokens_per_second:.1f} tok/s "
            f"({self.decode_tokens_per_second:.1f} decoding), {self.steps} steps, "
            + (f"acceptance rate {self.acceptance_rate:.1%}, " if self.draft_tokens else "no draft token verified, ")
            + f"{self.mean_accepted_tokens:.2f} tokens/step"
        )
