"""Shared fixtures: real bundled models, a weaker same-vocabulary drafter, Spec-Bench prompts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from speculative.backends.base import ForwardRequest
from speculative.cost_model import CostModel

ROOT = Path(__file__).resolve().parent.parent
SPEC_BENCH = Path(os.environ.get("SPEC_BENCH", ROOT / "src" / "speculative" / "data" / "spec_bench" / "question.jsonl"))


def spec_bench_prompts(n_per_category: dict[str, int] | None = None) -> list[dict]:
    """A fixed selection of Spec-Bench questions, first turn only (tests never tune on them)."""
    assert SPEC_BENCH.is_file(), f"Spec-Bench questions not found at {SPEC_BENCH}"
    rows = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]
    want = n_per_category or {
        "writing": 1, "coding": 1, "translation": 2, "summarization": 2, "qa": 2, "math_reasoning": 1, "rag": 1,
    }
    out, seen = [], {}
    for r in rows:
        c = r["category"]
        if seen.get(c, 0) < want.get(c, 0):
            seen[c] = seen.get(c, 0) + 1
            out.append(r)
    return out


@pytest.fixture(scope="session")
def prompts10() -> list[dict]:
    p = spec_bench_prompts()
    assert len(p) >= 10
    return p


@pytest.fixture(scope="session")
def smol():
    from speculative.backends import load_backend

    b = load_backend("smollm2-135m-instruct", n_ctx=4096)
    yield b
    b.close()


@pytest.fixture(scope="session")
def gemma():
    from speculative.backends import load_backend

    b = load_backend("gemma-3-270m", n_ctx=4096)
    yield b
    b.close()


def weak_drafter_path(target: str, quant: str = "Q2_K") -> Path:
    """A lower-bit re-quantization of ``target`` (derived once, kept in the cache folder)."""
    from speculative.cache import cache_dir
    from speculative.derive import derive_drafter

    out = cache_dir("test-drafters") / f"{target}-{quant}.gguf"
    if not out.is_file():
        derive_drafter(target, out, quant=quant)
    return out


@pytest.fixture(scope="session")
def smol_weak_path() -> Path:
    return weak_drafter_path("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma_weak_path() -> Path:
    return weak_drafter_path("gemma-3-270m")


class FrozenCost(CostModel):
    """A verification cost table T(n) that the engine's own timings do not refine: a test chooses what the
    adaptive policy sees, whatever this machine's load (or its cached table) says."""

    def update(self, n: int, seconds: float) -> None:
        pass


class SequenceStub:
    """The sequence bookkeeping of a backend stand-in that keeps no cache (for :func:`next_logits_fresh`)."""

    def allocate_sequence(self, prompt):
        return 0

    def truncate(self, seq, n):
        pass

    def release_sequence(self, seq, keep_cache=True):
        pass


def next_logits_fresh(backend, tokens: list[int]) -> np.ndarray:
    """Next-token logits after ``tokens``, from a fresh prefill in a cleared sequence."""
    seq = backend.allocate_sequence(())
    try:
        backend.truncate(seq, 0)
        out = backend.forward([ForwardRequest(seq, tokens, logits="last")])[0].logits[-1].copy()
    finally:
        backend.release_sequence(seq, keep_cache=False)
    return out


def assert_greedy_identical(backend, prompt_ids, plain, spec, *, exact: bool, label: str = "", ties: list | None = None,
                            resume=None):
    """Spec output must equal plain greedy output, all of it.

    With ``exact`` (a batch-invariant backend) they must be identical. Otherwise a divergence is
    accepted only at a near-tie of the plain run (top-2 logit gap < 1e-3 after the reference's tokens
    before it), is reported through ``ties``, and the rest is still checked: ``resume(prefix, n)``
    decodes n tokens speculatively after the prompt and ``prefix`` (the reference's tokens up to and
    including the tied one), and that continuation must match the rest of the reference by the same
    rule, tie after tie, to the end.
    """
    offset = 0  # spec continues the reference from plain[offset]
    while list(spec) != list(plain[offset:]):
        rest = plain[offset:]
        j = next((j for j, (a, b) in enumerate(zip(rest, spec)) if a != b), min(len(rest), len(spec)))
        i = offset + j
        msg = f"{label}: outputs diverge at new token {i} (plain {plain[i:i+5]}, spec {spec[j:j+5]})"
        assert not exact, msg
        assert j < len(rest) and j < len(spec), msg + " (one is a prefix of the other)"
        logits = next_logits_fresh(backend, list(prompt_ids) + list(plain[:i]))
        top2 = np.sort(logits)[-2:]
        gap = float(top2[1] - top2[0])
        assert gap < 1e-3, msg + f"; the top-2 gap there is {gap:.2e}, not a tie"
        if ties is not None:
            ties.append((label, i, gap))
        print(f"[tie] {msg}; top-2 gap {gap:.2e}")
        assert resume is not None, msg + ": a near-tie, and no resume= to check the output after it"
        offset = i + 1
        if offset >= len(plain):
            return
        spec = list(resume(list(plain[:offset]), len(plain) - offset))


def resume_with(gen, prompt_ids, **overrides):
    """``resume=`` for :func:`assert_greedy_identical`: ``gen`` decoding after ``prompt_ids`` + a prefix,
    with the same ``overrides`` as the run being checked."""
    return lambda prefix, n: gen.generate(list(prompt_ids) + list(prefix), max_new_tokens=n, **overrides).token_ids


class InProcessServer:
    """The HTTP server on a free loopback port, in a thread (uvicorn), for tests."""

    def __init__(self, generator, model_name: str):
        import socket
        import threading
        import time

        import uvicorn

        from speculative.server import ServerState, create_app

        self.state = ServerState(generator, model_name)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._srv = uvicorn.Server(uvicorn.Config(create_app(self.state), host="127.0.0.1", port=port, log_level="error"))
        self._thread = threading.Thread(target=self._srv.run, daemon=True)
        self._thread.start()
        for _ in range(400):
            if self._srv.started:
                break
            time.sleep(0.05)
        assert self._srv.started, "the test server did not start"

    def close(self) -> None:
        self._srv.should_exit = True
        self._thread.join(timeout=10)
        self.state.close()
