"""Drafters and the ``--drafter`` spec: ``TYPE[:NAME_OR_PATH][,key=value...]``.

Examples: ``none``, ``ngram``, ``ngram,min=1,max=4``, ``model:smollm2-135m-instruct``,
``model:/path/to/draft.gguf,threads=1``, ``suffix,tree=4``; ``suffix[,...]+OTHER`` combines the
suffix drafter with another one (:class:`~speculative.drafters.combined.CombinedDrafter`).

New drafter types register a factory under a new TYPE word with
:func:`register_drafter`; the CLI, bench and server need no new flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..backends.base import Backend
from ..errors import ConfigError
from .base import HEAD_PRECISIONS, BuildContext, DraftProposal, Drafter, DraftState, NoDrafter
from .draft_model import DraftModelDrafter
from .ngram import NgramDrafter


@dataclass(frozen=True)
class DrafterSpec:
    """A parsed ``--drafter`` value."""

    kind: str
    name: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    #: the drafter combined with this one (``suffix,...+OTHER``), or None
    other: DrafterSpec | None = None

    def __str__(self) -> str:
        s = self.kind + (f":{self.name}" if self.name else "")
        s += "".join(f",{k}={v}" for k, v in self.options.items())
        return s + (f"+{self.other}" if self.other is not None else "")


@dataclass(frozen=True)
class DrafterType:
    """A registered drafter TYPE.

    Attributes:
        kind: the TYPE word.
        factory: ``(spec, target, ctx) -> Drafter``.
        options: accepted option keys and their help.
        needs_name: whether ``:NAME_OR_PATH`` is required, forbidden (False) or optional (None).
        help: one line for ``speculative drafters``.
    """

    kind: str
    factory: Callable[[DrafterSpec, Backend, BuildContext], Drafter]
    options: dict[str, str]
    needs_name: bool | None
    help: str


DRAFTER_TYPES: dict[str, DrafterType] = {}


def register_drafter(t: DrafterType) -> DrafterType:
    DRAFTER_TYPES[t.kind] = t
    return t


def parse_drafter_spec(spec: str) -> DrafterSpec:
    """Parse ``TYPE[:NAME_OR_PATH][,key=value...]``.

    Raises:
        ConfigError: empty spec, unknown TYPE, unknown or malformed option, missing name.
    """
    if spec is None or not str(spec).strip():
        raise ConfigError("empty --drafter spec; try 'ngram', 'none' or 'model:NAME'")
    cut = _combination_cut(str(spec))
    if cut is not None:
        first, rest = str(spec)[:cut], str(spec)[cut + 1:]
        if not rest.strip():
            raise ConfigError(f"'{spec}' names no drafter after '+': try 'suffix+ngram' or 'suffix+model:NAME'")
        left, right = parse_drafter_spec(first), parse_drafter_spec(rest)
        if left.kind != "suffix" or right.kind in ("suffix", "none"):
            raise ConfigError(f"'{spec}': only 'suffix[,...]+OTHER' combines drafters (OTHER: a draft model, "
                              "a head or ngram)")
        return DrafterSpec(left.kind, left.name, left.options, right)
    head, *opts = [p.strip() for p in str(spec).strip().split(",")]
    kind, _, name = head.partition(":")
    kind = kind.strip().lower()
    name = name.strip() or None
    if kind == "auto":
        raise ConfigError(f"'{spec}': 'auto' (the target's recommended drafter) takes no options or combination; "
                          "name the drafter to set its options")
    if kind not in DRAFTER_TYPES:
        raise ConfigError(f"unknown drafter type '{kind}': choose one of {', '.join(sorted(DRAFTER_TYPES))} "
                          "(or 'auto')")
    t = DRAFTER_TYPES[kind]
    if t.needs_name is True and not name:
        raise ConfigError(f"drafter '{kind}' needs a model: '{kind}:NAME_OR_PATH'")
    if t.needs_name is False and name:
        raise ConfigError(f"drafter '{kind}' takes no ':{name}'")
    options: dict[str, str] = {}
    for o in opts:
        if not o:
            continue
        key, eq, val = o.partition("=")
        key = key.strip()
        if not eq or not val.strip():
            raise ConfigError(f"drafter option '{o}' must be key=value")
        if key not in t.options:
            allowed = ", ".join(sorted(t.options)) or "none"
            raise ConfigError(f"unknown option '{key}' for drafter '{kind}' (accepted: {allowed})")
        if key in options:
            raise ConfigError(f"drafter option '{key}' is given twice in '{spec}'")
        options[key] = val.strip()
    return DrafterSpec(kind, name, options)


def _combination_cut(spec: str) -> int | None:
    """Where ``spec`` joins two drafters: the first '+' followed by a drafter TYPE word (or by nothing),
    so that a '+' inside a path (``cache=/tmp/a+b.npz``) stays part of it; None for a single drafter."""
    for i, ch in enumerate(spec):
        if ch == "+":
            head = spec[i + 1:].split(",", 1)[0].split(":", 1)[0].strip().lower()
            if not head or head in DRAFTER_TYPES:
                return i
    return None


def _int_option(spec: DrafterSpec, key: str, default: int | None, minimum: int = 0) -> int | None:
    if key not in spec.options:
        return default
    raw = spec.options[key]
    try:
        v = int(raw)
    except ValueError:
        raise ConfigError(f"drafter option {key}={raw} must be an integer") from None
    if v < minimum:
        raise ConfigError(f"drafter option {key}={v} must be >= {minimum}")
    return v


def build_drafter(spec: str | DrafterSpec, target: Backend, ctx: BuildContext | None = None) -> Drafter:
    """Build and bind the drafter of ``spec`` for ``target``.

    Raises:
        ConfigError, ModelNotFoundError, ModelLoadError, VocabularyMismatchError.
    """
    if not isinstance(spec, DrafterSpec):
        spec = parse_drafter_spec(spec)
    ctx = ctx or BuildContext(backend=target.name)
    if spec.other is not None:
        from .combined import CombinedDrafter

        other = build_drafter(spec.other, target, ctx)
        try:
            drafter = CombinedDrafter(DRAFTER_TYPES[spec.kind].factory(spec, target, ctx), other)
        except BaseException:
            other.close()
            raise
    else:
        drafter = DRAFTER_TYPES[spec.kind].factory(spec, target, ctx)
    try:
        drafter.bind(target)
        drafter.warm_up()
    except BaseException:
        drafter.close()
        raise
    return drafter


def _none(spec, target, ctx) -> Drafter:
    return NoDrafter()


def _ngram(spec, target, ctx) -> Drafter:
    return NgramDrafter(
        min_n=_int_option(spec, "min", 1, 1), max_n=_int_option(spec, "max", 4, 1), tree=_int_option(spec, "tree", 0, 0)
    )


def tree_leaves(spec: str | DrafterSpec) -> int:
    """Most leaves of the token trees a drafter spec may propose (0: chains only)."""
    if not isinstance(spec, DrafterSpec):
        spec = parse_drafter_spec(spec)
    width = _int_option(spec, "tree", 0, 0) or 0
    if spec.other is not None:
        return max(tree_leaves(DrafterSpec(spec.kind, spec.name, spec.options)), tree_leaves(spec.other))
    if width and spec.kind == "suffix":
        return 2 * width  # branches at a few depths; the policy cuts the least confident leaves to fit
    if width and spec.kind in ("eagle", "eagle3", "medusa"):
        # heads add width - 1 sibling leaves per depth along the spine; room for 8 depths
        # (deeper trees are cut to fit, least confident leaves first)
        return (width - 1) * 8 + 1
    return width


def _suffix(spec, target, ctx) -> Drafter:
    from .suffix import SuffixDrafter

    def _float(key: str, default: float) -> float:
        raw = spec.options.get(key)
        try:
            return default if raw is None else float(raw)
        except ValueError:
            raise ConfigError(f"drafter option {key}={raw} must be a number") from None

    use_global = spec.options.get("global", "on").lower()
    if use_global not in ("on", "off"):
        raise ConfigError(f"drafter option global={use_global} must be on or off")
    return SuffixDrafter(
        max_pattern=_int_option(spec, "max", 32, 1), factor=_float("factor", 1.0), tree=_int_option(spec, "tree", 0, 0),
        min_prob=_float("min_prob", 0.1), use_global=use_global == "on",
        capacity=_int_option(spec, "capacity", 200_000),
        cache=spec.options.get("cache"),
    )


def _model(spec, target, ctx) -> Drafter:
    from ..backends import load_backend

    backend = spec.options.get("backend", ctx.backend)
    n_ctx = _int_option(spec, "ctx", ctx.n_ctx, 0)
    draft = load_backend(
        spec.name,
        backend,
        n_ctx=n_ctx,
        n_threads=_int_option(spec, "threads", ctx.n_threads, 1),
        max_sequences=ctx.max_sequences,
        numerics=ctx.numerics,
        device=ctx.device,
        dtype=ctx.dtype,
    )
    try:
        return _draft_model_drafter(spec, target, draft)
    except BaseException:
        draft.close()
        raise


def _draft_model_drafter(spec, target, draft) -> Drafter:
    """Same vocabulary: a plain draft model; another tokenizer: the cross-vocabulary bridge."""
    from ..errors import VocabularyMismatchError
    from .cross_vocab import VOCAB_MODES, CrossVocabDrafter
    from .token_bridge import compare_vocabularies

    mode = spec.options.get("vocab", "auto")
    if mode not in VOCAB_MODES:
        raise ConfigError(f"drafter option vocab={mode} must be one of {', '.join(VOCAB_MODES)}")
    if mode in ("auto", "same"):
        cmp = compare_vocabularies(target, draft)
        if cmp.same:
            return DraftModelDrafter(draft)
        if mode == "same":
            raise VocabularyMismatchError(
                f"vocab=same, but draft model {draft.model_id} has another tokenizer than target "
                f"{target.model_id}: {cmp.reason}; leave vocab= out (auto) or use vocab=text or vocab=intersect"
            )
    return CrossVocabDrafter(draft, mode)


def trained_drafter_dir(name: str) -> Path:
    """A shipped drafter's folder (``src/speculative/data/drafters/NAME``) or a path to a trained drafter folder.

    Raises:
        ModelNotFoundError: neither exists.
    """
    from importlib import resources

    from ..errors import ModelNotFoundError

    shipped = Path(str(resources.files("speculative") / "data" / "drafters" / name))
    if (shipped / "drafter.json").is_file():
        return shipped
    p = Path(name).expanduser()
    if (p / "drafter.json").is_file():
        return p
    if (p / "drafter" / "drafter.json").is_file():  # a train-drafter output folder
        return p / "drafter"
    hint = ""
    if (p / "config.json").is_file():
        hint = " (it looks like a published checkpoint: convert it with `speculative import-drafter` first)"
    raise ModelNotFoundError(
        f"unknown drafter '{name}': not a shipped drafter ({', '.join(shipped_drafters()) or 'none'}) "
        f"nor a folder with drafter.json{hint}"
    )


#: the drafter spec of a target with no recommended drafter of its own
FALLBACK_DRAFTER = "ngram"


def default_drafter(target: str) -> str:
    """The drafter that ``auto`` (the default of ``--drafter`` and ``from_pretrained``) means for
    ``target``: the registered target's recommended drafter when every shipped drafter it names is
    installed (the adaptive policy still decides, per request, whether drafting pays), else n-gram."""
    from ..models import REGISTRY

    entry = REGISTRY.get(target)
    spec = entry.drafter if entry is not None else None
    if not spec:
        return FALLBACK_DRAFTER
    shipped = set(shipped_drafters())
    names = [part.split(":", 1)[1].split(",", 1)[0] for part in spec.split("+") if ":" in part]
    return spec if all(n in shipped for n in names) else FALLBACK_DRAFTER


def resolve_drafter(target: str, spec: str | None) -> str:
    """The drafter spec to build for ``target``: ``spec`` itself, "none" for None, and
    :func:`default_drafter` for "auto". The one place where "auto" is resolved (CLI and
    ``from_pretrained``)."""
    if spec is None:
        return "none"
    return default_drafter(target) if spec == "auto" else spec


def shipped_drafters() -> list[str]:
    from importlib import resources

    root = Path(str(resources.files("speculative") / "data" / "drafters"))
    return sorted(p.name for p in root.glob("*") if (p / "drafter.json").is_file()) if root.is_dir() else []


_PRECISION_HELP = ("the head's layers on the CPU: int8 (dynamically quantized), fp32, or auto (default: what its "
                   "drafter.json recommends, else fp32)")


def _precision_option(spec: DrafterSpec) -> str | None:
    """A head's ``precision=`` option: int8 or fp32, or None for auto (what its drafter.json recommends).

    Raises:
        ConfigError: another value.
    """
    raw = spec.options.get("precision", "auto").lower()
    if raw not in ("auto", *HEAD_PRECISIONS):
        raise ConfigError(f"drafter option precision={spec.options['precision']} must be one of "
                          f"{', '.join(('auto', *HEAD_PRECISIONS))}")
    return None if raw == "auto" else raw


def _eagle(spec, target, ctx) -> Drafter:
    from .heads import EagleDrafter

    dev = ctx.device or ("cpu" if target.name == "llama.cpp" else str(getattr(target, "device", "cpu")))
    return EagleDrafter(trained_drafter_dir(spec.name), tree=_int_option(spec, "tree", 0, 0), device=dev,
                        precision=_precision_option(spec), draft_vocab=_int_option(spec, "vocab", None, 1))


def _eagle3(spec, target, ctx) -> Drafter:
    from .heads import Eagle3Drafter

    dev = ctx.device or ("cpu" if target.name == "llama.cpp" else str(getattr(target, "device", "cpu")))
    return Eagle3Drafter(trained_drafter_dir(spec.name), tree=_int_option(spec, "tree", 0, 0), device=dev,
                         precision=_precision_option(spec))


def _medusa(spec, target, ctx) -> Drafter:
    from .heads import MedusaDrafter

    dev = ctx.device or ("cpu" if target.name == "llama.cpp" else str(getattr(target, "device", "cpu")))
    return MedusaDrafter(trained_drafter_dir(spec.name), tree=_int_option(spec, "tree", 0, 0), device=dev)


register_drafter(DrafterType("none", _none, {}, False, "no drafter: plain autoregressive decoding (the baseline)"))
register_drafter(
    DrafterType(
        "ngram",
        _ngram,
        {
            "min": "shortest n-gram to match (default 1)",
            "max": "longest n-gram to match (default 4)",
            "tree": "merge the continuations of the W most recent matches into a token tree (default 0: a chain)",
        },
        False,
        "prompt lookup: continue the longest earlier n-gram match in prompt and output",
    )
)
register_drafter(
    DrafterType(
        "suffix",
        _suffix,
        {
            "max": "longest suffix of the context matched (tokens; default 32)",
            "factor": "at most factor x (match length) draft tokens per step (default 1)",
            "tree": "most branches per node: a token tree of the most frequent continuations (default 0: a chain)",
            "min_prob": "leave out continuations seen in fewer than this share of matches (default 0.1)",
            "global": "on (default): also match earlier requests of the same tenant; off: this request only",
            "capacity": "tokens of earlier requests kept, all tenants together; oldest evicted "
            "(default 200000, about 100 MB)",
            "cache": "a file that keeps earlier requests across runs (default: memory only)",
        },
        False,
        "suffix decoding: continue the longest match in this and earlier requests; combine: suffix+OTHER",
    )
)
register_drafter(
    DrafterType(
        "model",
        _model,
        {
            "ctx": "draft model context size (default: the target's)",
            "threads": "CPU threads of the draft model",
            "backend": "backend of the draft model (default: the target's)",
            "vocab": "auto (default: the same ids if the tokenizers match, else text bridge under greedy and "
            "token intersection under sampling), same, text or intersect",
        },
        True,
        "a draft model (registered name, GGUF path or HF id); another tokenizer is bridged",
    )
)

register_drafter(
    DrafterType(
        "eagle",
        _eagle,
        {"tree": "also propose the next B-1 candidates at every depth (a token tree; default 0: a chain)",
         "precision": _PRECISION_HELP,
         "vocab": "propose only the N most frequent tokens of the head's draft vocabulary (default: all of it; "
                  "fewer LM-head rows to read per draft token)"},
        True,
        "an EAGLE-style head on the target's hidden states (shipped name or trained folder)",
    )
)
register_drafter(
    DrafterType(
        "eagle3",
        _eagle3,
        {"tree": "also propose the next B-1 candidates at every depth (a token tree; default 0: a chain)",
         "precision": _PRECISION_HELP},
        True,
        "an imported EAGLE-3 head on three target layers' hidden states (transformers backend)",
    )
)
register_drafter(
    DrafterType(
        "medusa",
        _medusa,
        {"tree": "top-B candidates of every head (a static token tree; default 0: the top-1 chain)"},
        True,
        "Medusa heads on the target's hidden states (shipped name or trained folder)",
    )
)

__all__ = [
    "BuildContext",
    "DraftProposal",
    "DraftState",
    "Drafter",
    "DrafterSpec",
    "DRAFTER_TYPES",
    "register_drafter",
    "parse_drafter_spec",
    "tree_leaves",
    "build_drafter",
    "NoDrafter",
    "NgramDrafter",
    "DraftModelDrafter",
]
