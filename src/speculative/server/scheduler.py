"""Continuous batching of speculative steps across requests.

One thread owns the models. Each iteration it admits waiting requests (prefill,
one prompt at a time), asks every running request's drafter for a draft, sizes
the drafts for the whole batch, runs ONE target forward holding every request's
last token and draft tokens (ragged: each request its own count), then verifies,
rolls back and emits per request.

Sizing (the batch form of the adaptive policy, :mod:`speculative.cost_model`):
starting from no drafts, the draft token with the highest probability of being
reached and accepted is added while that probability exceeds the time it adds
to the batch's forward, T(n+1) - T(n), valued at the batch's plain decoding
rate (running requests / T(running requests)). As the batch grows, the rate
grows and the marginal cost stays, so speculation steps back by itself, as
vLLM's spec-decode does by disabling speculation above a batch size.
Requests with the "fixed" policy verify their whole draft.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..drafters.base import DraftProposal
from ..engine import SpeculativeGenerator
from ..request import DecodeRequest
from ..stats import GenerationStats

Event = tuple[str, object]


@dataclass
class Job:
    """A request handed to the scheduler; ``on_event`` is called from the scheduler thread with
    ("tokens", [ids]), ("done", GenerationResult) or ("error", exception)."""

    request: DecodeRequest
    on_event: Callable[[str, object], None]
    cancelled: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None


class Scheduler:
    """Runs speculative decoding for many concurrent requests on one generator.

    Args:
        generator: target, drafter and cost model; its backend's ``max_sequences`` bounds the batch.
        metrics: optional :class:`~speculative.server.metrics.Metrics`.
    """

    def __init__(self, generator: SpeculativeGenerator, metrics=None):
        self.gen = generator
        self.target = generator.target
        self.metrics = metrics
        self.max_running = self.target.max_sequences
        self._waiting: deque[Job] = deque()
        self._tasks: list[Callable[[], None]] = []
        self._running: list[Job] = []
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="speculative-scheduler", daemon=True)
        self.totals = GenerationStats()
        self._thread.start()

    # ---- API (any thread) ---------------------------------------------------------------

    def submit(self, job: Job) -> Job:
        with self._cv:
            self._waiting.append(job)
            self._cv.notify()
        return job

    def cancel(self, job: Job) -> None:
        """Stop a request at the next step boundary and free its sequence."""
        with self._cv:
            job.cancelled = True
            self._cv.notify()

    def call(self, fn: Callable[[], object], timeout: float = 60.0) -> object:
        """Run ``fn`` in the scheduler thread between steps (it owns the models) and return its result."""
        done = threading.Event()
        box: dict = {}

        def task():
            try:
                box["value"] = fn()
            except Exception as e:  # pragma: no cover - re-raised in the caller
                box["error"] = e
            finally:
                done.set()

        with self._cv:
            self._tasks.append(task)
            self._cv.notify()
        if not done.wait(timeout):
            raise TimeoutError("the scheduler did not run the task in time")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def load(self) -> tuple[int, int]:
        with self._cv:
            return len(self._running), len(self._waiting)

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    # ---- the loop (scheduler thread) --------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and not self._running and not self._tasks:
                    self._cv.wait(timeout=1.0)
                if self._stop:
                    break
                tasks, self._tasks = self._tasks, []
                admitted = []
                while self._waiting and len(self._running) + len(admitted) < self.max_running:
                    admitted.append(self._waiting.popleft())
                if self.metrics:
                    self.metrics.set_load(len(self._running) + len(admitted), len(self._waiting))
            for task in tasks:
                task()
            for job in admitted:
                if job.cancelled:
                    self._end(job, cancelled=True)
                    continue
                try:
                    new = job.request.prefill()
                except Exception as e:  # a failure of one request must not stop the server
                    self._fail(job, e)
                    continue
                job.first_token_at = time.perf_counter()
                job.on_event("tokens", new)
                if job.request.done:
                    self._end(job)
                else:
                    self._running.append(job)
            self._drop_cancelled()
            if self._running:
                try:
                    self._step()
                except Exception as e:  # pragma: no cover - a backend failure ends the batch's requests
                    for job in list(self._running):
                        self._fail(job, e)
            if self.metrics:
                with self._cv:
                    self.metrics.set_load(len(self._running), len(self._waiting))
        for job in self._running + list(self._waiting):
            self._end(job, cancelled=True)

    def _drop_cancelled(self) -> None:
        with self._cv:
            cancelled = [j for j in self._running if j.cancelled]
        for job in cancelled:
            self._running.remove(job)
            self._end(job, cancelled=True)

    def _step(self) -> None:
        """One speculative step of every running request (see :meth:`DecodeRequest.step`), its three
        phases split around one batched target forward."""
        jobs = list(self._running)
        drafts = [j.request.propose() for j in jobs]
        live = [(j, d) for j, d in zip(jobs, drafts) if not j.request.done]
        for j in jobs:
            if j.request.done:
                self._running.remove(j)
                self._end(j)
        if not live:
            return
        selections = self._size_drafts([j.request for j, _ in live], [d.proposal for _, d in live])
        fwds = [j.request.verify_request(d, sel) for (j, d), sel in zip(live, selections)]
        t = time.perf_counter()
        outs = self.target.forward(fwds)
        dt = time.perf_counter() - t
        total = sum(len(f.tokens) for f in fwds)
        self.gen.cost_model.update(total, dt)
        emitted = 0
        for (job, draft), out in zip(live, outs):
            req = job.request
            new = req.commit(draft, out)  # not timed alone: the batch's time is no one request's
            emitted += len(new)
            job.on_event("tokens", new)
            if req.done:
                self._running.remove(job)
                self._end(job)
        if self.metrics:
            self.metrics.observe_step(len(live), total, emitted, dt)

    def _size_drafts(self, reqs: list[DecodeRequest], proposals: list[DraftProposal]) -> list:
        """Chain length (or, for a token tree, the node list) to verify for each request."""
        lengths: list = [0] * len(reqs)
        heap = []  # (-probability of reaching and accepting the next token, request index)
        cum = [1.0] * len(reqs)
        for i, (r, p) in enumerate(zip(reqs, proposals)):
            if not p.tokens:
                continue
            if p.parents is not None:
                lengths[i] = r.choose(p)  # trees are sized per request
                continue
            if r.plan.cost is None or p.confidence is None or p.probs is not None:
                # fixed policy, or a sampled draft (verified whole: see selection.chain_length)
                lengths[i] = len(p.tokens)
                continue
            cum[i] = max(0.0, min(1.0, p.confidence[0]))
            heapq.heappush(heap, (-cum[i], i))
        if not heap:
            return lengths
        cost = self.gen.cost_model
        n = len(reqs)
        total = n + sum(x if isinstance(x, int) else len(x) for x in lengths)
        rate = n / cost.time(n)  # tokens/s of plain batched decoding
        while heap:
            neg, i = heapq.heappop(heap)
            gain = -neg
            if gain <= rate * (cost.time(total + 1) - cost.time(total)):
                break
            lengths[i] += 1
            total += 1
            conf = proposals[i].confidence
            if lengths[i] < len(proposals[i].tokens):
                cum[i] *= max(0.0, min(1.0, conf[lengths[i]]))
                heapq.heappush(heap, (-cum[i], i))
        return lengths

    def _end(self, job: Job, cancelled: bool = False) -> None:
        req = job.request
        req.release()
        if cancelled:
            job.on_event("error", RuntimeError("cancelled"))
            if self.metrics:
                self.metrics.observe_request(req, "cancelled", job)
            return
        res = req.result()
        self.totals.merge(res.stats)
        if self.metrics:
            self.metrics.observe_request(req, res.finish_reason, job)
        job.on_event("done", res)

    def _fail(self, job: Job, exc: Exception) -> None:
        try:
            job.request.release()
        finally:
            if job in self._running:
                self._running.remove(job)
            job.on_event("error", exc)
