"""``speculative bench-server``: total throughput of the HTTP server under concurrent clients.

Starts the server in-process on a loopback port and drives it with the
``openai`` client from N threads: the same requests at each concurrency level,
with speculation on and off (the per-request switch), greedy so outputs can be
checked equal. Concurrency 1 is serving the clients one after another.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .datasets import load_questions, select
from .report import environment


@dataclass
class ServeBenchConfig:
    target: str = "smollm2-135m-instruct"
    drafter: str = "ngram"
    backend: str = "llama.cpp"
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    requests: int = 8
    max_tokens: int = 128
    dataset: str = "spec-bench"
    categories: tuple[str, ...] | None = None
    n_ctx: int = 4096
    threads: int | None = None
    k: int = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_serve_bench(cfg: ServeBenchConfig, output: Path, progress: bool = True) -> dict:
    """Run the measurement; writes ``serve.json`` and ``serve.md`` under ``output`` and returns the results."""
    import openai
    import uvicorn
    from tqdm import tqdm

    from ..config import GenerationConfig
    from ..engine import SpeculativeGenerator
    from ..server import ServerState, create_app

    if not cfg.concurrency or min(cfg.concurrency) < 1 or cfg.requests < 1 or cfg.max_tokens < 1:
        raise ConfigError("concurrency levels, --requests and --max-tokens must be >= 1")
    qs = select(load_questions(cfg.dataset), list(cfg.categories) if cfg.categories else None, None)
    step = max(1, len(qs) // cfg.requests)
    prompts = [q.turns[0] for q in qs[::step]][: cfg.requests]
    gen = SpeculativeGenerator.from_pretrained(
        cfg.target, drafter=cfg.drafter, backend=cfg.backend, n_ctx=cfg.n_ctx, n_threads=cfg.threads,
        max_sequences=max(cfg.concurrency), config=GenerationConfig(num_speculative_tokens=cfg.k),
    )
    state = ServerState(gen, gen.target.model_id)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="error"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    chat = gen.target.chat_template is not None

    def one(prompt: str, speculative: bool) -> tuple[str, int]:
        extra = {"speculative": speculative}
        if chat:
            r = client.chat.completions.create(model=state.model_name, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=cfg.max_tokens, temperature=0, extra_body=extra)
            return r.choices[0].message.content, r.usage.completion_tokens
        r = client.completions.create(model=state.model_name, prompt=prompt, max_tokens=cfg.max_tokens,
                                      temperature=0, extra_body=extra)
        return r.choices[0].text, r.usage.completion_tokens

    rows = []
    outputs: dict[bool, list[str]] = {}
    total_runs = len(cfg.concurrency) * 2
    bar = tqdm(total=total_runs, desc="bench-server", disable=not progress)
    try:
        one(prompts[0], True)  # warm-up
        for c in cfg.concurrency:
            row = {"concurrency": c}
            for spec in (True, False):
                state.scheduler.call(gen.reset_caches)  # no prefix reuse from the previous measurement
                t0 = time.perf_counter()
                with ThreadPoolExecutor(c) as ex:
                    res = list(ex.map(lambda p, s=spec: one(p, s), prompts))
                dt = time.perf_counter() - t0
                toks = sum(n for _, n in res)
                texts = [t for t, _ in res]
                outputs.setdefault(spec, texts)
                row["speculative" if spec else "plain"] = {"seconds": dt, "tokens": toks, "tokens_per_second": toks / dt}
                row.setdefault("outputs_match", True)
                row["outputs_match"] &= texts == outputs[spec]
                bar.update(1)
            row["speculation_gain"] = row["speculative"]["tokens_per_second"] / row["plain"]["tokens_per_second"]
            rows.append(row)
    finally:
        bar.close()
        server.should_exit = True
        th.join(timeout=10)
        state.close()
        gen.close()
    same = outputs.get(True) == outputs.get(False)
    seq = next((r for r in rows if r["concurrency"] == 1), rows[0])
    for r in rows:
        r["scaling_vs_sequential"] = r["speculative"]["tokens_per_second"] / seq["speculative"]["tokens_per_second"]
    results = {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()},
               "environment": environment(), "rows": rows, "greedy_outputs_equal": same}
    output.mkdir(parents=True, exist_ok=True)
    (output / "serve.json").write_text(json.dumps(results, indent=1))
    (output / "serve.md").write_text(serve_markdown(results))
    return results


def serve_markdown(results: dict) -> str:
    c = results["config"]
    lines = [
        f"# Server throughput: {c['target']}, drafter {c['drafter']}, {c['requests']} requests of "
        f"{c['max_tokens']} tokens, greedy",
        "",
        f"{results['environment']['date']}, {results['environment']['cpus']} CPUs. Greedy outputs equal with "
        f"speculation on and off: {'yes' if results['greedy_outputs_equal'] else 'NO'}.",
        "",
        "| concurrent clients | tok/s, speculation on | tok/s, speculation off | speculation gain | vs one after another |",
        "|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['concurrency']} | {r['speculative']['tokens_per_second']:.1f} | {r['plain']['tokens_per_second']:.1f} | "
            f"{r['speculation_gain']:.2f}x | {r['scaling_vs_sequential']:.2f}x |"
        )
    lines.append("")
    return "\n".join(lines)


def default_serve_output(cfg: ServeBenchConfig) -> Path:
    name = Path(cfg.target).stem if os.sep in cfg.target else cfg.target
    return Path("bench-results") / f"serve-{name}-{cfg.backend}"
