"""Which llama.cpp CPU matmul kernels this build runs, and where the batch-invariant patch lives.

The exact numerics mode needs every position's logits to be independent of the
batch size (see :mod:`speculative.numerics`). Today's exact build gets that by
computing each (weight row, token) dot product on its own with ggml's
``vec_dot``, so a forward over n tokens costs about n single-token forwards.
``patches/llama-cpp-batch-invariant.patch`` (applied by ``scripts/setup.sh``,
build option ``GGML_CPU_BATCH_INVARIANT_MM``) adds multi-token kernels that
unpack each quantized weight block once for several tokens while every token
keeps ``vec_dot``'s own floating-point operations, so the outputs stay bitwise
those of ``vec_dot`` (docs/kernels.md).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "patches" / "llama-cpp-batch-invariant.patch"
LLAMA_CPP_VERSION = "0.3.36"  # the version scripts/setup.sh pins and the patch is made for
#: weight types with a multi-token kernel in the patch (x86-64 with AVX2)
MULTI_TOKEN_TYPES = ("Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")
#: weight types with multi-row tiles in a build with AVX2 and no AVX-512 (with AVX-512: every multi-token type)
MULTI_ROW_TYPES_AVX2 = ("Q4_K", "Q6_K")


@dataclass(frozen=True)
class KernelInfo:
    """What the loaded llama.cpp build's system-info line says about its matmul kernels.

    Attributes:
        batch_invariant_mm: the patch's multi-token kernels are built in ("BATCH_INVARIANT_MM = 1").
        llamafile: llamafile's sgemm is built in (batch-variant; exact mode cannot use this build).
        avx2: the CPU backend was compiled with AVX2 (the multi-token kernels need it).
        avx512: compiled with AVX-512 (every multi-token type then also has 512-bit tiles of up to
            16 weight rows x 16 tokens: Q4_1, Q5_0 and Q8_0 from 2 tokens on, Q4_K and Q6_K from 9;
            with AVX2 only, Q4_K and Q6_K have 256-bit tiles of up to 16 rows x 8 tokens, from 3).
    """

    batch_invariant_mm: bool
    llamafile: bool
    avx2: bool
    avx512: bool = False

    @property
    def summary(self) -> str:
        """One line for ``speculative doctor``."""
        if self.batch_invariant_mm and self.avx2:
            rows = ("; 512-bit multi-row tiles: Q4_1, Q5_0, Q8_0 from 2 tokens, Q4_K, Q6_K from 9"
                    if self.avx512 else f"; 256-bit multi-row tiles: {', '.join(MULTI_ROW_TYPES_AVX2)} from 3 tokens")
            return (f"batch-invariant multi-token kernels for {', '.join(MULTI_TOKEN_TYPES)} "
                    f"(one weight unpack per token group{rows}; other types: per-pair vec_dot)")
        if self.batch_invariant_mm:
            return "batch-invariant build without AVX2: per-pair vec_dot for every type (exact, not faster)"
        return "per-pair vec_dot (exact; a forward over n tokens costs about n single-token forwards)"


def parse_system_info(info: str) -> KernelInfo:
    """Parse llama.cpp's ``llama_print_system_info()`` line ('CPU : AVX2 = 1 | ... |')."""
    flags = {part.split("=")[0].strip() for part in info.replace(":", "|").split("|") if part.strip().endswith("= 1")}
    return KernelInfo("BATCH_INVARIANT_MM" in flags, "LLAMAFILE" in flags, "AVX2" in flags, "AVX512" in flags)


def kernel_info() -> KernelInfo:
    """:func:`parse_system_info` of the llama.cpp build this process loads."""
    from .backends.llama_cpp import system_info

    return parse_system_info(system_info())


def patch_key() -> str:
    """First 12 hex digits of the patch's sha256 (part of the set-up's wheel cache key)."""
    return hashlib.sha256(PATCH.read_bytes()).hexdigest()[:12]


def patched_include_dir() -> Path:
    """The patched ggml headers that ``scripts/setup.sh`` keeps for the native kernel test.

    ``$SPECULATIVE_GGML_INCLUDE`` overrides. The folder may be missing (set-up not run, or the
    patch did not apply); callers check.
    """
    env = os.environ.get("SPECULATIVE_GGML_INCLUDE")
    if env:
        return Path(env)
    base = Path(os.environ.get("SPECULATIVE_CACHE_DIR") or Path.home() / ".cache" / "speculative")
    return base / "src" / f"llama-cpp-python-{LLAMA_CPP_VERSION}-bimm-{patch_key()}" / "include"


def llama_lib_dir() -> Path:
    """The folder of the ggml/llama shared libraries llama-cpp-python loads (``$LLAMA_CPP_LIB_PATH`` first)."""
    env = os.environ.get("LLAMA_CPP_LIB_PATH")
    if env:
        return Path(env)
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("llama-cpp-python is not installed")
    return Path(spec.origin).parent / "lib"
