"""Prometheus metrics of the server (prometheus_client), modelled on vLLM's spec_decode metrics."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()  # no *_created series: they double the exposition for no use here


class Metrics:
    """Counters of requests, tokens, speculative steps and per-position acceptance; load gauges."""

    def __init__(self, model: str) -> None:
        self.registry = r = CollectorRegistry()
        self.model = model
        L = ["model"]
        self.requests = Counter("speculative_requests_total", "Finished requests", L + ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("speculative_prompt_tokens_total", "Prompt tokens processed", L, registry=r)
        self.generation_tokens = Counter("speculative_generation_tokens_total", "Tokens generated", L, registry=r)
        self.steps = Counter("speculative_steps_total", "Decoding steps (target forward passes that emitted tokens, per request)", L, registry=r)
        self.draft_tokens = Counter("speculative_draft_tokens_total", "Draft tokens verified", L, registry=r)
        self.accepted_tokens = Counter("speculative_accepted_tokens_total", "Draft tokens accepted", L, registry=r)
        self.pos_draft = Counter("speculative_draft_tokens_per_position_total", "Steps whose draft had a token at this position", L + ["position"], registry=r)
        self.pos_accepted = Counter("speculative_accepted_tokens_per_position_total", "Steps that accepted the draft token at this position", L + ["position"], registry=r)
        self.running = Gauge("speculative_running_requests", "Requests being decoded", L, registry=r)
        self.waiting = Gauge("speculative_waiting_requests", "Requests waiting for a sequence", L, registry=r)
        self.tokens_per_second = Gauge("speculative_tokens_per_second", "Tokens generated per second over the last batched steps", L, registry=r)
        self.batch_tokens = Histogram("speculative_batch_tokens", "Tokens per batched target forward", L,
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.ttft = Histogram("speculative_time_to_first_token_seconds", "Time to first token", L, registry=r)
        self.latency = Histogram("speculative_request_latency_seconds", "Request latency", L, registry=r)
        self._window: list[tuple[float, int]] = []

    def set_load(self, running: int, waiting: int) -> None:
        self.running.labels(self.model).set(running)
        self.waiting.labels(self.model).set(waiting)

    def observe_step(self, n_requests: int, n_tokens: int, emitted: int, seconds: float) -> None:
        """One batched forward of ``n_tokens`` tokens for ``n_requests`` requests that emitted ``emitted`` tokens."""
        self.batch_tokens.labels(self.model).observe(n_tokens)
        now = time.perf_counter()
        self._window.append((now, emitted))
        self._window = [(t, n) for t, n in self._window if now - t <= 10.0]
        span = max(now - self._window[0][0], seconds, 1e-3)
        self.tokens_per_second.labels(self.model).set(sum(n for _, n in self._window) / span)

    def observe_request(self, req, finish_reason: str, job) -> None:
        m = self.model
        s = req.stats
        self.requests.labels(m, finish_reason).inc()
        self.prompt_tokens.labels(m).inc(s.prompt_tokens)
        self.generation_tokens.labels(m).inc(s.new_tokens)
        self.steps.labels(m).inc(s.steps)
        self.draft_tokens.labels(m).inc(s.draft_tokens)
        self.accepted_tokens.labels(m).inc(s.accepted_tokens)
        for i, (p, a) in enumerate(zip(s.position_proposed, s.position_accepted)):
            if p:
                self.pos_draft.labels(m, str(i)).inc(p)
                self.pos_accepted.labels(m, str(i)).inc(a)
        now = time.perf_counter()
        if job.first_token_at is not None:
            self.ttft.labels(m).observe(job.first_token_at - job.submitted_at)
        self.latency.labels(m).observe(now - job.submitted_at)

    def render(self) -> bytes:
        return generate_latest(self.registry)
