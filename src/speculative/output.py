"""What a generation emits: per-token log-probabilities, the result, the output text
(incremental detokenization, stop strings), and the running :class:`Generation` a caller iterates.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .backends.base import Backend
from .stats import GenerationStats


@dataclass
class TokenLogprob:
    """An emitted token's log-probability under the target's processed distribution, and the top alternatives."""

    token: int
    logprob: float
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerationResult:
    """What one generation produced.

    Attributes:
        text: the generated text (end-of-generation tokens not rendered; cut before a stop string).
        token_ids: the generated token ids only (an ending EOS, or the token completing a stop string, included).
        finish_reason: "stop" (end-of-generation token or stop string) or "length" (max_new_tokens
            or the context window).
        stats: :class:`~speculative.stats.GenerationStats`.
        prompt_token_ids: the prompt as the target saw it.
        logprobs: one :class:`TokenLogprob` per token id, when asked for.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats
    prompt_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None

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


class OutputText:
    """The output's text with stop strings: what is final, and what may be streamed yet.

    ``streamable()`` withholds a tail that could still begin a stop string, so
    every streamed prefix is a prefix of the final text.
    """

    def __init__(self, backend: Backend, stops: Sequence[str] = ()):
        self.stream = TextStream(backend)
        self.stops = tuple(stops)
        self._max_stop = max((len(s) for s in self.stops), default=0)
        self._checked = 0
        self._floor = 0  # a stop string counts only if it ends past this many characters
        self.final: str | None = None

    def push(self, token: int, render: bool = True, check: bool = True) -> bool:
        """Add one token; True when a stop string is now complete. With ``check`` False (before
        ``min_tokens``) stop strings are not looked for, and those completed so far never count."""
        if render:
            self.stream.push([token])
        text = self.stream.text
        if not check:
            self._floor = self._checked = len(text)
            return False
        if self.stops and len(text) > self._checked:
            start = max(0, self._checked - self._max_stop + 1)
            hits = []
            for s in self.stops:
                i = text.find(s, start)
                while i >= 0 and i + len(s) <= self._floor:
                    i = text.find(s, i + 1)
                if i >= 0:
                    hits.append(i)
            self._checked = len(text)
            if hits:
                self.final = text[: min(hits)]
                return True
        return False

    def streamable(self) -> str:
        if self.final is not None:
            return self.final
        text = self.stream.text
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:n]):
                    hold = n
                    break
        return text[: len(text) - hold]

    def finish(self) -> str:
        if self.final is None:
            self.stream.flush()
            self.final = self.stream.text
        return self.final


class Generation:
    """A running generation. Iterate it for text pieces, or :meth:`blocks` for the
    token ids each step emitted; ``result`` is set once it ends.

    Text pieces withhold what may still start a stop string or is an incomplete
    UTF-8 character, so they concatenate to ``result.text``. Closing the
    generation early (``close()``, or dropping it) frees the target's sequence.

    Args:
        steps: the tokens each step emits (the request released when it ends or is closed).
        request: the :class:`~speculative.request.DecodeRequest` (its ``text`` and ``result()``).
    """

    def __init__(self, steps: Iterator[list[int]], request):
        self._steps = steps
        self._req = request
        self._sent = 0
        self.result: GenerationResult | None = None

    def blocks(self) -> Iterator[list[int]]:
        """Token ids emitted by each step (1..k+1 per step, cut at EOS / stop / max_new_tokens)."""
        yield from self._steps
        self.result = self._req.result()

    def __iter__(self) -> Iterator[str]:
        for _ in self._steps:
            piece = self._next_piece()
            if piece:
                yield piece
        self.result = self._req.result()
        tail = self.result.text[self._sent :]
        if tail:
            yield tail

    def _next_piece(self) -> str:
        text = self._req.text.streamable()
        piece = text[self._sent :]
        self._sent = len(text)
        return piece

    def close(self) -> None:
        self._steps.close()
