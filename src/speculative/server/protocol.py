"""OpenAI-compatible request bodies (the subset we serve) and their translation to a GenerationConfig.

Field names, types and defaults follow OpenAI's API reference; vLLM-style
extensions (``top_k``, ``min_p``, ``repetition_penalty``) and ours
(``num_speculative_tokens``, ``speculative``, ``draft_policy``) are optional.
Unknown fields are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import GenerationConfig, SamplingParams


class APIError(Exception):
    """An OpenAI-style error: HTTP status, message, type, param, code."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, description="most tokens to generate")
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 disables (extension)")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1, description="only 1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=64, description="k for this request")
    speculative: bool = Field(default=True, description="false decodes this request without drafting")
    draft_policy: Literal["adaptive", "fixed"] | None = None

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not s for s in stops):
            raise APIError(400, "stop strings must be non-empty", param="stop")
        if len(stops) > 16:
            raise APIError(400, "at most 16 stop strings", param="stop")
        return stops

    def bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        out = {}
        for k, v in self.logit_bias.items():
            try:
                tok = int(k)
            except ValueError:
                raise APIError(400, f"logit_bias keys must be token ids, got {k!r}", param="logit_bias") from None
            if tok < 0 or not -100.0 <= v <= 100.0:
                raise APIError(400, "logit_bias: ids >= 0, values in [-100, 100]", param="logit_bias")
            out[tok] = float(v)
        return out

    def generation_config(self, base: GenerationConfig, max_new_tokens: int, logprobs: int | None) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            num_speculative_tokens=self.num_speculative_tokens or base.num_speculative_tokens,
            sampling=SamplingParams(
                temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed, min_p=self.min_p,
                presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                repetition_penalty=self.repetition_penalty, logit_bias=self.bias(),
            ),
            draft_policy=self.draft_policy or base.draft_policy,
            speculative=self.speculative,
            stop=self.stops(),
            logprobs=logprobs,
        ).validate()


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is a string or a list of token ids."""

    prompt: str | list[int]
    max_tokens: int | None = Field(default=16)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise APIError(400, "only text content parts are supported", param="messages")
            parts.append(p["text"])
        return "".join(parts)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = None
