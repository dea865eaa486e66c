"""OpenAI-compatible request bodies (the subset we serve) and their translation to a GenerationConfig.

Field names, types and defaults follow OpenAI's API reference; vLLM-style
extensions (``top_k``, ``min_p``, ``min_tokens``, ``repetition_penalty``) and
ours (``num_speculative_tokens``, ``speculative``, ``draft_policy``) are optional.

Every field is either honoured, accepted and ignored because it cannot change
the result here (``user``, ``metadata``, ``store``, ...: see :class:`_Common`),
or refused with a 400 naming it: an unknown key, ``tools``, ``n`` or
``best_of`` other than 1, ``echo``, ``suffix``, ``stream_options`` without ``stream``, a batch
of several prompts.
Types are strict (JSON types as OpenAI documents them: no bool -> int, str -> bool
or str -> number coercion), numbers must be finite, and strings valid Unicode
(no lone surrogates, which have no UTF-8 form).
"""

from __future__ import annotations

import hashlib
import json

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AllowInfNan, BaseModel, ConfigDict, Field, Strict
from pydantic_core import PydanticCustomError

from ..config import GenerationConfig, SamplingParams
from ..constraints import ConstraintSpec
from ..errors import ConfigError


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


class JSONSchemaFormat(BaseModel):
    """``response_format.json_schema``: the schema the output must be valid under (always enforced,
    whatever ``strict`` says)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str | None = Field(default=None, max_length=64)
    description: str | None = None
    schema_: dict = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``{"type": "text"}``, ``{"type": "json_object"}`` or
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    def constraint(self) -> ConstraintSpec | None:
        """The output constraint; raises APIError (400) for a missing or invalid schema."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return ConstraintSpec.json_object()
        if self.json_schema is None:
            raise APIError(400, "response_format of type json_schema needs a json_schema object",
                           param="response_format")
        try:
            return ConstraintSpec.json_schema(self.json_schema.schema_).validate()
        except ConfigError as e:
            raise APIError(400, f"response_format: {e}", param="response_format") from None


def _unicode(s: str) -> str:
    """``s`` if it has a UTF-8 form (no lone surrogate, which JSON's \\uD800 escapes can produce)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError(
            "unicode", "not valid Unicode text: lone surrogate {char} at index {index}",
            {"char": f"\\u{ord(s[e.start]):04x}", "index": e.start},
        ) from None
    return s


def _refuse(allowed, why: str):
    """A validator refusing every value but the ``allowed(value)`` ones (400 naming the field)."""

    def check(v):
        if not allowed(v):
            raise PydanticCustomError("unsupported", why)
        return v

    return AfterValidator(check)


def unicode_text(s: str, param: str, where: str | None = None) -> str:
    """``s``, or an APIError (400) when it has a lone surrogate; its message starts with ``where`` (the place in
    the request, e.g. ``messages[1].content part 0``), else with ``param``."""
    try:
        return _unicode(s)
    except PydanticCustomError as e:
        raise APIError(400, f"{where or param}: {e.message()}", param=param) from None


#: strict JSON types: an integer field takes only integers, a boolean only true/false
SInt = Annotated[int, Strict()]
SBool = Annotated[bool, Strict()]
#: a JSON number (integers too), finite: NaN and infinities are refused
SFloat = Annotated[float, Strict(), AllowInfNan(False)]
#: a JSON string that is valid Unicode
SStr = Annotated[str, Strict(), AfterValidator(_unicode)]

_NO_TOOLS = ("tools are not supported: this server neither renders tool definitions nor parses tool calls "
             "(describe the tools in the messages instead)")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: SBool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: SStr | None = None
    max_tokens: SInt | None = Field(default=None, description="most tokens to generate")
    min_tokens: SInt = Field(default=0, ge=0, description="no EOS or stop string before this many tokens (vLLM)")
    temperature: SFloat = Field(default=1.0, ge=0.0, le=2.0)
    top_p: SFloat = Field(default=1.0, gt=0.0, le=1.0)
    top_k: SInt = Field(default=0, ge=0, description="0 disables (extension)")
    min_p: SFloat = Field(default=0.0, ge=0.0, le=1.0)
    seed: SInt | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: SStr | list[SStr] | None = None
    n: Annotated[SInt, _refuse(lambda v: v == 1, "only n = 1 is supported")] = 1
    stream: SBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: SFloat = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: SFloat = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: SFloat = Field(default=1.0, ge=0.01, le=10.0)  # below 0.01 logits overflow
    logit_bias: dict[str, SFloat] | None = None
    num_speculative_tokens: SInt | None = Field(default=None, ge=1, le=64, description="k for this request")
    speculative: SBool = Field(default=True, description="false decodes this request without drafting")
    draft_policy: Literal["adaptive", "fixed"] | None = None
    # names the tenant (with the API key): what drafters and the draft policy learn across requests is per tenant
    user: SStr | None = None
    # accepted and ignored: they cannot change the result here
    metadata: dict[str, Any] | None = None
    store: SBool | None = None
    service_tier: SStr | None = None
    prompt_cache_key: SStr | None = None
    safety_identifier: SStr | None = None
    parallel_tool_calls: SBool | None = None  # only means something with tools, which are refused
    # refused unless they say "nothing"
    tools: Annotated[Any, _refuse(lambda v: v is None or v == [], _NO_TOOLS)] = None
    tool_choice: Annotated[Any, _refuse(lambda v: v is None or v == "none", _NO_TOOLS)] = None
    functions: Annotated[Any, _refuse(lambda v: v is None or v == [], _NO_TOOLS)] = None
    function_call: Annotated[Any, _refuse(lambda v: v is None or v == "none", _NO_TOOLS)] = None
    response_format: ResponseFormat | None = None

    def check_stream_options(self) -> None:
        """OpenAI and vLLM refuse ``stream_options`` on a request that does not stream (400)."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")

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

    def generation_config(self, base: GenerationConfig, max_new_tokens: int, logprobs: int | None,
                          api_key: str = "") -> GenerationConfig:
        """The request's generation settings. Its tenant is the API key (the ``Authorization: Bearer``
        token, kept only as a SHA-256 prefix) and the ``user`` field together: requests that differ in
        either never share what a drafter or its draft policy learned across requests
        (:attr:`GenerationConfig.tenant`)."""
        tenant = ""
        if api_key or self.user:
            key = hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key else ""
            tenant = f"{key}/{self.user or ''}"
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
            min_tokens=min(self.min_tokens, max_new_tokens),  # the window may end the output sooner
            constraint=self.response_format.constraint() if self.response_format is not None else None,
            tenant=tenant,
        ).validate()


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is a string or a list of token ids; OpenAI's batch forms
    (a list of strings, a list of token-id lists) are taken when they hold one prompt (see
    :meth:`single_prompt`)."""

    prompt: SStr | list[SInt] | list[SStr] | list[list[SInt]]
    max_tokens: SInt | None = Field(default=16)
    logprobs: SInt | None = Field(default=None, ge=0, le=5)
    echo: Annotated[SBool, _refuse(lambda v: not v, "echo is not supported")] = False
    best_of: Annotated[SInt | None, _refuse(lambda v: v in (None, 1), "only best_of = 1 is supported")] = None
    suffix: Annotated[SStr | None, _refuse(lambda v: not v, "suffix (insertion) is not supported")] = None

    def single_prompt(self) -> str | list[int]:
        """The one prompt: a string or token ids. A batch of several prompts is refused (400), since
        every choice here answers one prompt (``n`` = 1)."""
        p = self.prompt
        if isinstance(p, str) or not p or isinstance(p[0], int):
            return p
        if len(p) != 1:
            raise APIError(400, f"prompt: a batch of {len(p)} prompts is not supported; send one request per prompt",
                           param="prompt")
        return p[0]


class ChatMessage(BaseModel):
    """One message; ``name`` and ``tool_call_id`` go to the chat template as they are (it renders them
    or not). What an earlier assistant answer carries back with nothing in it (``tool_calls: null``,
    ``refusal: null``, ...) is accepted; tool calls themselves are refused like ``tools``."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: SStr | list[dict] | None = None
    name: SStr | None = None
    tool_call_id: SStr | None = None
    tool_calls: Annotated[Any, _refuse(lambda v: not v, _NO_TOOLS)] = None
    function_call: Annotated[Any, _refuse(lambda v: not v, _NO_TOOLS)] = None
    refusal: SStr | None = None
    audio: Annotated[Any, _refuse(lambda v: not v, "audio is not supported")] = None
    annotations: Annotated[Any, _refuse(lambda v: not v, "message annotations are not supported")] = None

    def text(self, index: int) -> str:
        """The message's text: its string, or its text parts joined. ``index`` is the message's place in
        ``messages`` (from 0); every error names it.

        Raises:
            APIError: 400 for a system, developer or user message without content, an empty list of parts, a part
                that is not text, a text part without a string ``text`` or with fields of its own.
        """
        where = f"messages[{index}]"
        if self.content is None:
            if self.role in ("system", "developer", "user"):
                raise APIError(400, f"{where}: a {self.role} message needs content", param="messages")
            return ""
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            raise APIError(400, f"{where}.content: an empty list of parts; send a string or at least one text part",
                           param="messages")
        parts = []
        for i, p in enumerate(self.content):
            if p.get("type") != "text":
                raise APIError(400, f"{where}.content part {i} has type {json.dumps(p.get('type'))}: only text "
                               "content parts are supported", param="messages")
            if not isinstance(p.get("text"), str):
                raise APIError(400, f"{where}.content part {i}: 'text' must be a string", param="messages")
            unknown = sorted(set(p) - {"type", "text"})
            if unknown:
                raise APIError(400, f"{where}.content part {i}: unknown field(s) {', '.join(map(repr, unknown))}",
                               param="messages")
            parts.append(unicode_text(p["text"], "messages", f"{where}.content part {i}"))
        return "".join(parts)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: SBool = False
    top_logprobs: SInt | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: SInt | None = None
