"""The OpenAI-compatible HTTP API (FastAPI): completions, chat completions, models, health, metrics.

Every error is an OpenAI-style JSON body ``{"error": {"message", "type", "param", "code"}}``
with a 4xx status for bad requests; the server keeps serving after each.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine import SpeculativeGenerator
from ..errors import SpeculativeError
from ..output import GenerationResult, TokenLogprob
from ..request import DecodeRequest
from .metrics import Metrics
from .protocol import APIError, ChatCompletionRequest, CompletionRequest
from .scheduler import Job, Scheduler


class ServerState:
    """What the routes share: the generator, its scheduler and metrics, and the served model name."""

    def __init__(self, generator: SpeculativeGenerator, model_name: str):
        self.gen = generator
        self.model_name = model_name
        self.metrics = Metrics(model_name)
        _ = generator.cost_model  # measure (or load) T(n) before the first request
        self.scheduler = Scheduler(generator, self.metrics)
        self.created = int(time.time())

    def close(self) -> None:
        self.scheduler.shutdown()


_UNION_TAGS = ("str", "int", "float", "bool")


def _loc(e: dict) -> list[str]:
    """An error's location in the body, without pydantic's tags for union members (``list[int]``)."""
    tag = lambda x: isinstance(x, str) and ("[" in x or x in _UNION_TAGS)  # noqa: E731
    return [str(x) for x in e.get("loc", ()) if x != "body" and not tag(x)]


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    if not errs:
        return "invalid request", None
    if any(e.get("type") == "json_invalid" for e in errs):
        return "the request body is not valid JSON", None
    # the most telling error: a refused value over a wrong type (union members each fail), then the deepest
    e = min(errs, key=lambda e: (str(e.get("type", "")).endswith("_type"), -len(e.get("loc", ()))))
    loc = _loc(e)
    param = ".".join(loc) or None
    kind = e.get("type")
    msg = e.get("msg", "invalid value")
    if param is None:  # the body as a whole
        if kind == "missing":
            return "the request body is missing: send a JSON object", None
        if isinstance(e.get("input"), (bytes, str)):  # FastAPI parses JSON only when the request says it is JSON
            return "the request body must be a JSON object sent with Content-Type: application/json", None
        return "the request body must be a JSON object", None
    if kind == "extra_forbidden":
        return (f"unsupported field '{param}': this server does not know it, and ignoring it could change "
                "the result"), param
    if kind == "finite_number":
        msg = "must be a finite number"
    return (f"{param}: {msg}" if param else msg), param


def create_app(state: ServerState) -> FastAPI:
    """The FastAPI application serving ``state``'s model."""
    app = FastAPI(title="speculative", version="1", description="OpenAI-compatible server with lossless speculative decoding")
    app.state.spec = state
    target = state.gen.target

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        msg, param = _validation_message(exc)
        return JSONResponse(APIError(400, msg, param=param).body(), status_code=400)

    @app.exception_handler(SpeculativeError)
    async def _user_error(request: Request, exc: SpeculativeError):
        return JSONResponse(APIError(400, str(exc)).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = "not_found" if exc.status_code == 404 else None
        return JSONResponse(APIError(exc.status_code, str(exc.detail), code=code).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):  # pragma: no cover - a bug, reported as such
        return JSONResponse(APIError(500, f"internal error: {exc}", type_="server_error").body(), status_code=500)

    @app.get("/health")
    async def health():
        running, waiting = state.scheduler.load()
        return {"status": "ok", "running": running, "waiting": waiting}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": state.model_name, "object": "model", "created": state.created, "owned_by": "speculative",
                      "max_model_len": target.n_ctx}],
        }

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def _check_model(name: str | None) -> None:
        if name is not None and name != state.model_name:
            raise APIError(404, f"model '{name}' does not exist; this server serves '{state.model_name}'",
                           param="model", code="model_not_found")

    def _budget(n_prompt: int, max_tokens: int | None, param: str) -> int:
        if n_prompt == 0:
            raise APIError(400, "the prompt is empty", param="prompt")
        room = target.n_ctx - n_prompt
        if room < 1:
            raise APIError(400, f"the prompt has {n_prompt} tokens; this model's context window is {target.n_ctx} "
                           "tokens and must leave room for at least one new token", param="prompt",
                           code="context_length_exceeded")
        if max_tokens is None:
            return room
        if max_tokens < 1:
            raise APIError(400, f"{param} must be >= 1, got {max_tokens}", param=param)
        # a prompt that fits generates until max_tokens or the window is full (finish_reason "length")
        return min(max_tokens, room)

    def _check_min_tokens(body, max_tokens: int | None) -> None:
        if max_tokens is not None and max_tokens >= 1 and body.min_tokens > max_tokens:  # < 1: max_tokens' own error
            raise APIError(400, f"min_tokens ({body.min_tokens}) must not exceed max_tokens ({max_tokens})",
                           param="min_tokens")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_model(body.model)
        body.check_stream_options()
        _check_min_tokens(body, body.max_tokens)
        prompt = body.single_prompt()
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "the prompt is empty", param="prompt")
            ids = target.encode(prompt)
        else:
            ids = list(prompt)
            if any(t < 0 or t >= target.vocab_size for t in ids):
                raise APIError(400, f"prompt token ids must be in [0, {target.vocab_size})", param="prompt")
        max_new = _budget(len(ids), body.max_tokens, "max_tokens")
        cfg = body.generation_config(state.gen.config, max_new, body.logprobs, _api_key(request))
        return await _serve(request, body, ids, cfg, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check_model(body.model)
        body.check_stream_options()
        if target.chat_template is None:
            raise APIError(400, f"{state.model_name} has no chat template; use /v1/completions", param="messages")
        msgs = [{"role": m.role if m.role != "developer" else "system", "content": m.text(i),
                 **{k: v for k, v in (("name", m.name), ("tool_call_id", m.tool_call_id)) if v is not None}}
                for i, m in enumerate(body.messages)]
        try:
            ids = target.apply_chat_template(msgs)
        except Exception as e:  # template errors (e.g. unsupported role order) are the request's fault
            raise APIError(400, f"the chat template rejected the messages: {e}", param="messages") from None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        _check_min_tokens(body, max_tokens)
        max_new = _budget(len(ids), max_tokens, "max_tokens")
        lp = (body.top_logprobs or 0) if body.logprobs else None
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        cfg = body.generation_config(state.gen.config, max_new, lp, _api_key(request))
        return await _serve(request, body, ids, cfg, chat=True, messages=msgs)

    def _api_key(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        return auth[7:].strip() if auth[:7].lower() == "bearer " else ""

    async def _serve(request: Request, body, ids, cfg, chat: bool, messages: list[dict] | None = None):
        if cfg.sampling.logit_bias and max(cfg.sampling.logit_bias) >= target.vocab_size:
            raise APIError(400, f"logit_bias token ids must be < {target.vocab_size}", param="logit_bias")
        req = state.gen.open_request(ids, cfg, messages=messages)
        bridge = _Bridge(asyncio.get_running_loop(), req)
        job = state.scheduler.submit(Job(req, bridge.on_event))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        fmt = _Formatter(target, state.model_name, rid, chat)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                _sse(bridge, job, fmt, include_usage, state.scheduler), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        result = await _wait(bridge, job, request, state.scheduler)
        if result is None:
            return Response(status_code=499)  # the client went away
        return JSONResponse(fmt.full(result))

    return app


class _Bridge:
    """Carries scheduler events (scheduler thread) to the request's coroutine (event loop thread).

    Text deltas are computed in the scheduler thread, the only one touching the request.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, req: DecodeRequest):
        self.loop = loop
        self.req = req
        self.queue: asyncio.Queue = asyncio.Queue()
        self.sent = 0
        self.n_tokens = 0
        self.done = False

    def on_event(self, kind: str, payload) -> None:
        if kind == "tokens":
            text = self.req.text.streamable()
            piece = text[self.sent :]
            self.sent = len(text)
            lps = self.req.logprobs[self.n_tokens :] if self.req.logprobs is not None else None
            self.n_tokens = len(self.req.out)
            item = ("delta", piece, lps)
        elif kind == "done":
            res: GenerationResult = payload
            lps = res.logprobs[self.n_tokens :] if res.logprobs is not None else None
            item = ("done", res.text[self.sent :], lps, res)
        else:
            item = ("error", payload)
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


async def _wait(bridge: _Bridge, job: Job, request: Request, scheduler: Scheduler) -> GenerationResult | None:
    """Wait for the result, checking every 0.25 s that the client is still there."""
    next_check = time.monotonic() + 0.25
    while True:
        try:
            item = await asyncio.wait_for(bridge.queue.get(), timeout=0.25)
        except asyncio.TimeoutError:
            item = None
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + 0.25
            if await request.is_disconnected():
                scheduler.cancel(job)
                return None
        if item is None or item[0] == "delta":
            continue
        if item[0] == "done":
            return item[3]
        if item[0] == "error":
            raise APIError(500, f"generation failed: {item[1]}", type_="server_error")


async def _sse(bridge: _Bridge, job: Job, fmt: _Formatter, include_usage: bool, scheduler: Scheduler) -> AsyncIterator[bytes]:
    finished = False
    try:
        yield fmt.sse(fmt.chunk_start())
        while True:
            item = await bridge.queue.get()
            if item[0] == "delta":
                _, piece, lps = item
                if piece or lps:
                    yield fmt.sse(fmt.chunk(piece, lps, None))
            elif item[0] == "done":
                _, piece, lps, res = item
                yield fmt.sse(fmt.chunk(piece, lps, res.finish_reason))
                if include_usage:
                    yield fmt.sse(fmt.usage_chunk(res))
                yield b"data: [DONE]\n\n"
                finished = True
                return
            else:
                yield fmt.sse({"error": APIError(500, f"generation failed: {item[1]}", type_="server_error").body()["error"]})
                finished = True
                return
    finally:
        if not finished:
            scheduler.cancel(job)  # the client disconnected: free the slot now


class _Formatter:
    """OpenAI response objects for completions and chat completions."""

    def __init__(self, backend, model: str, rid: str, chat: bool):
        self.backend = backend
        self.model = model
        self.id = rid
        self.chat = chat
        self.created = int(time.time())
        self._offset = 0

    @staticmethod
    def sse(obj: dict) -> bytes:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()

    def _token_str(self, t: int) -> str:
        s = self.backend.decode([t])
        return s if s else self.backend.token_text(t)

    def _usage(self, res: GenerationResult) -> dict:
        s = res.stats
        return {
            "prompt_tokens": len(res.prompt_token_ids),
            "completion_tokens": len(res.token_ids),
            "total_tokens": len(res.prompt_token_ids) + len(res.token_ids),
            "prompt_tokens_details": {"cached_tokens": s.cached_prompt_tokens},
            "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
        }

    def _logprobs(self, lps: list[TokenLogprob] | None):
        if lps is None:
            return None
        if self.chat:
            content = []
            for lp in lps:
                tok = self._token_str(lp.token)
                content.append({
                    "token": tok, "logprob": lp.logprob, "bytes": list(tok.encode("utf-8")),
                    "top_logprobs": [
                        {"token": (s := self._token_str(i)), "logprob": v, "bytes": list(s.encode("utf-8"))}
                        for i, v in lp.top_logprobs
                    ],
                })
            return {"content": content}
        toks, offs = [], []
        for lp in lps:
            tok = self._token_str(lp.token)
            toks.append(tok)
            offs.append(self._offset)
            self._offset += len(tok)
        return {
            "tokens": toks,
            "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{self._token_str(i): v for i, v in lp.top_logprobs} for lp in lps],
            "text_offset": offs,
        }

    def full(self, res: GenerationResult) -> dict:
        lps = self._logprobs(res.logprobs)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": res.text}, "logprobs": lps,
                      "finish_reason": res.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": res.text, "logprobs": lps, "finish_reason": res.finish_reason}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice],
                "usage": self._usage(res)}

    def chunk_start(self) -> dict:
        if self.chat:
            return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None})
        return self._chunk({"index": 0, "text": "", "logprobs": None, "finish_reason": None})

    def chunk(self, piece: str, lps, finish_reason: str | None) -> dict:
        lp = self._logprobs(lps) if lps else None
        if self.chat:
            choice = {"index": 0, "delta": {"content": piece} if piece else {}, "logprobs": lp,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": piece, "logprobs": lp, "finish_reason": finish_reason}
        return self._chunk(choice)

    def usage_chunk(self, res: GenerationResult) -> dict:
        c = self._chunk(None)
        c["choices"] = []
        c["usage"] = self._usage(res)
        return c

    def _chunk(self, choice) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice] if choice else []}


def listening_socket(host: str, port: int):
    """A TCP socket bound to (host, port), for :func:`run_server` (uvicorn listens on it).

    Binding first lets the command refuse a busy port or an unknown host before it loads any model.

    Raises:
        SpeculativeError: the host does not resolve, or the address cannot be bound (in use, not this machine's,
            a privileged port).
    """
    import socket

    from ..errors import SpeculativeError

    ipv6 = ":" in host  # uvicorn's rule: IPv6 only for a literal IPv6 host ("localhost" stays IPv4)
    where = f"[{host}]:{port}" if ipv6 else f"{host}:{port}"
    sock = socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts reuse the port
        sock.bind((host, port))
    except socket.gaierror as e:
        sock.close()
        raise SpeculativeError(f"--host {host}: {e.strerror}") from None
    except OSError as e:
        sock.close()
        raise SpeculativeError(f"cannot listen on {where}: {e.strerror or e}") from None
    return sock


def run_server(generator: SpeculativeGenerator, model_name: str, host: str, port: int, log_level: str = "info",
               sock=None) -> None:
    """Serve until interrupted (uvicorn), on ``sock`` (from :func:`listening_socket`) or else on (host, port)."""
    import uvicorn

    state = ServerState(generator, model_name)
    app = create_app(state)
    try:
        if sock is None:
            uvicorn.run(app, host=host, port=port, log_level=log_level)
        else:
            uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])
    finally:
        state.close()
        if sock is not None:
            sock.close()


__all__ = ["ServerState", "create_app", "listening_socket", "run_server"]
