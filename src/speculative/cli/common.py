"""Options and helpers shared by the commands: model and sampling options, loading the generator, reading files."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import SpeculativeError


def _add_model_options(p: argparse.ArgumentParser, *, drafter: bool = True) -> None:
    from ..backends import BACKENDS, DEFAULT_BACKEND
    from ..models import DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET, help=f"target model: registered name, GGUF path, HF folder or id (default {DEFAULT_TARGET})")
    if drafter:
        p.add_argument(
            "--drafter",
            default=None,
            help="drafter spec TYPE[:NAME_OR_PATH][,key=value...]: none, ngram[,min=N,max=N,tree=W], model:NAME, "
            "eagle:NAME[,tree=B,precision=int8|fp32,vocab=N], eagle3:FOLDER (transformers backend), medusa:NAME[,tree=B], "
            "suffix[,cache=PATH,...] (suffix decoding, remembers earlier requests), suffix[,...]+OTHER (suffix first, then OTHER) "
            "(default: auto, the target's recommended drafter, ngram where it has none; "
            "`speculative drafters` lists them)",
        )
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS, help=f"default {DEFAULT_BACKEND}")
    p.add_argument("--ctx-size", type=int, default=4096, help="context window in tokens per sequence (0: the model's maximum; default 4096)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads, kept fixed (default: physical cores, fewer while other processes keep "
                        "them busy; llama.cpp with exact numerics)")
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
    from ..config import DEFAULT_NUM_SPECULATIVE_TOKENS

    p.add_argument("--k", "--num-speculative-tokens", dest="k", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS,
                   help=f"most draft tokens per step (default {DEFAULT_NUM_SPECULATIVE_TOKENS})")
    p.add_argument("--max-new-tokens", type=int, default=128, help="default 128")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 disables (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 disables (default)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below min-p times the top probability; 0 disables (default)")
    p.add_argument("--seed", type=int, default=None,
                   help="random seed for sampling: the same output again under --draft-policy fixed (the "
                        "adaptive policy's draft lengths follow measured timings, so its samples differ "
                        "between runs; their distribution does not)")
    p.add_argument("--draft-policy", default="adaptive", choices=("adaptive", "fixed"),
                   help="adaptive: verify only the draft tokens worth their cost (default); fixed: verify all, up to k")


def _load_generator(args, max_sequences: int = 1):
    from ..config import GenerationConfig, SamplingParams
    from ..engine import SpeculativeGenerator

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
    from ..drafters import parse_drafter_spec, resolve_drafter

    drafter = resolve_drafter(args.target, "auto" if args.drafter is None else args.drafter)
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
    from ..constraints import ConstraintSpec

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


def _wrap_paragraphs(text: str, width: int = 88) -> str:
    import textwrap

    return "\n\n".join(textwrap.fill(p, width) for p in text.split("\n\n"))
