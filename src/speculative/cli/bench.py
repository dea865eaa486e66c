"""``speculative bench | acceptance | bench-server``."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import SpeculativeError


def cmd_bench(args) -> int:
    from ..bench import BenchConfig, BenchRunner
    from ..bench.peers import PEER_NAMES

    peers = list(args.peer or [])
    if args.peers == "auto" and not args.peer:
        # llama.cpp's unmodified default build (built once on first use, about 6 minutes): the fastest
        # plain decoder that headline ratios are taken against
        peers = ["llama-server"] if args.backend == "llama.cpp" else []
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401

            peers += ["transformers", "transformers-lookup"]
        except ImportError:
            pass
    elif args.peers == "none" and not args.peer:
        peers = []
    for p in peers:
        if p not in PEER_NAMES and not p.startswith("transformers-assisted:"):
            raise SpeculativeError(f"unknown peer '{p}': choose from {', '.join(PEER_NAMES)}")
    cfg = BenchConfig(
        target=args.target, backend=args.backend, drafters=args.drafter or ["ngram"], peers=peers,
        endpoint=args.endpoint, dataset=args.dataset, categories=args.categories, per_category=args.per_category,
        max_new_tokens=args.max_new_tokens, k=args.k, sweep_k=args.sweep_k, draft_policy=args.draft_policy,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, n_ctx=args.ctx_size,
        threads=args.threads, numerics=args.numerics, device=args.device, dtype=args.dtype, chat=args.chat,
        peer_draft=args.peer_draft,
    )
    cfg.generation_config()  # validate before loading anything
    runner = BenchRunner(cfg, output=args.output, fresh=args.fresh, progress=not args.no_progress)
    try:
        runner.load_methods()
        results = runner.run()
    finally:
        runner.close()
    print((runner.output / "results.md").read_text())
    print(f"results: {runner.output}/results.json, results.md, " + ", ".join(results.get("plots", [])))
    if results["failures"]:
        print(f"error: {len(results['failures'])} run(s) differ from plain greedy decoding (see results.md)", file=sys.stderr)
        return 1
    return 0


def cmd_acceptance(args) -> int:
    from ..bench.acceptance import AcceptanceConfig, AcceptanceRun

    per, over = args.per_category
    cfg = AcceptanceConfig(
        target=args.target, backend=args.backend, drafters=args.drafter or ["ngram"], dataset=args.dataset,
        categories=args.categories, per_category=per, per_category_overrides=over,
        max_new_tokens=args.max_new_tokens, ks=args.k, n_ctx=args.ctx_size, threads=args.threads,
        numerics=args.numerics, chat=args.chat, device=args.device, dtype=args.dtype,
    )
    run = AcceptanceRun(cfg, output=args.output, fresh=args.fresh, progress=not args.no_progress,
                        plain_from=args.plain_from)
    try:
        run.load()
        run.run(report_only=args.report_only)
    finally:
        run.close()
    print((run.output / "acceptance.md").read_text())
    print(f"results: {run.output}/acceptance.json, acceptance.md")
    return 0


def cmd_bench_server(args) -> int:
    from ..bench.serve import ServeBenchConfig, default_serve_output, run_serve_bench

    cfg = ServeBenchConfig(
        target=args.target, drafter=args.drafter or "ngram", backend=args.backend, concurrency=tuple(args.concurrency),
        requests=args.requests, max_tokens=args.max_tokens, dataset=args.dataset,
        categories=tuple(args.categories) if args.categories else None, n_ctx=args.ctx_size, threads=args.threads,
        k=args.k,
    )
    from ..drafters import parse_drafter_spec

    parse_drafter_spec(cfg.drafter)
    out = Path(args.output) if args.output else default_serve_output(cfg)
    res = run_serve_bench(cfg, out, progress=not args.no_progress)
    print((out / "serve.md").read_text())
    print(f"results: {out}/serve.json, serve.md")
    return 0 if res["greedy_outputs_equal"] else 1
