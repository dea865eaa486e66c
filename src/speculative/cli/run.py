"""``speculative generate | serve | check | profile | doctor | models``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import ConfigError, SpeculativeError
from .common import _load_generator


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


def cmd_serve(args) -> int:
    try:
        from ..server import listening_socket, run_server
    except ImportError as e:  # pragma: no cover - fastapi/uvicorn are dependencies
        raise SpeculativeError(f"the server needs fastapi and uvicorn: {e}") from None
    if not 1 <= args.port <= 65535:
        raise SpeculativeError(f"--port must be in 1..65535, got {args.port}")
    if args.parallel < 1:
        raise SpeculativeError(f"--parallel must be >= 1, got {args.parallel}")
    sock = listening_socket(args.host, args.port)  # a busy port fails now, not after loading the models
    try:
        gen = _load_generator(args, max_sequences=args.parallel)
    except BaseException:
        sock.close()
        raise
    name = args.served_model_name or gen.target.model_id
    print(f"serving {name} ({gen.drafter.description}) on http://{args.host}:{args.port}/v1", file=sys.stderr)
    try:
        run_server(gen, name, args.host, args.port, log_level=args.log_level, sock=sock)
    finally:
        gen.close()
    return 0


def cmd_check(args) -> int:
    from ..check import CheckConfig, load_prompts, run_check
    from ..check_report import format_report, write_json
    from ..config import SamplingParams
    from ..drafters import parse_drafter_spec

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
    from ..drafters import resolve_drafter

    drafter = resolve_drafter(args.target, "auto" if args.drafter is None else args.drafter)
    if parse_drafter_spec(drafter).kind == "none":
        raise SpeculativeError("--drafter none is plain decoding: there is nothing to check")
    from ..engine import SpeculativeGenerator

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


def cmd_profile(args) -> int:
    from ..backends import load_backend
    from ..cache import write_json_atomic
    from ..profiling import format_profile, profile_target

    if args.max_tokens < 1 or args.context < 1 or args.repeats < 1 or args.rounds < 1:
        raise SpeculativeError("--max-tokens, --context, --repeats and --rounds must be >= 1")
    try:
        sizes = sorted({int(x) for x in args.sizes.split(",")}) if args.sizes else list(range(1, args.max_tokens + 1))
    except ValueError:
        raise SpeculativeError(f"--sizes must be comma-separated integers, got {args.sizes!r}") from None
    if min(sizes) < 1:
        raise SpeculativeError("--sizes must be >= 1")
    b = load_backend(args.target, args.backend, n_ctx=max(args.ctx_size, args.context + max(sizes) + 1),
                     n_threads=args.threads, numerics=args.numerics, device=args.device, dtype=args.dtype)
    try:
        def progress(r, n):
            print(f"[profile] round {r}/{n} done", file=sys.stderr, flush=True)

        report = profile_target(b, sizes, context_tokens=args.context, repeats=args.repeats, rounds=args.rounds,
                                progress=progress)
    finally:
        b.close()
    report["target"] = args.target
    if args.output:
        write_json_atomic(Path(args.output), report)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_profile(report))
    return 0


def cmd_doctor(args) -> int:
    from ..doctor import run_doctor

    return run_doctor(check_models=not args.quick)


def cmd_models(args) -> int:
    from ..models import REGISTRY

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
