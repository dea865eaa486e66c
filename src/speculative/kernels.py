"""Which llama.cpp CPU matmul kernels this build runs, what the machine can do, and where the patch lives.

The exact numerics mode needs every position's logits to be independent of the
batch size (see :mod:`speculative.numerics`). ``patches/llama-cpp-batch-invariant.patch``
(applied by ``scripts/setup.sh``, build option ``GGML_CPU_BATCH_INVARIANT_MM``) adds
CPU_BIMM, an extra buffer type of ggml's CPU backend: weights of the types it has
kernels for are repacked at load into groups of 16 rows whose blocks are interleaved
(one SIMD lane per row), and every (row, token) output is computed in one fixed order
of operations whatever the number of tokens, so batches of any size give bitwise the
single-token logits while a forward over n tokens reads the weights once
(docs/kernels.md). Other weights keep ggml's per-pair ``vec_dot``, batch-invariant too.

The library also measures what bounds the kernels on this machine:
:func:`read_bandwidth` (bytes per second that the decoding threads read) and
:func:`peak_macs` (integer multiply-adds per second of the kernels' inner instruction).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "patches" / "llama-cpp-batch-invariant.patch"
LLAMA_CPP_VERSION = "0.3.36"  # the version scripts/setup.sh pins and the patch is made for
#: weight types CPU_BIMM repacks (rows a multiple of 16) in builds with AVX2 or AVX-512
BIMM_TYPES = ("Q4_K", "Q6_K", "Q5_0", "Q8_0", "Q4_1")


@dataclass(frozen=True)
class KernelInfo:
    """What the loaded llama.cpp build's system-info line says about its matmul kernels.

    Attributes:
        batch_invariant_mm: the patch is built in ("BATCH_INVARIANT_MM = 1").
        llamafile: llamafile's sgemm is built in (batch-variant; exact mode cannot use this build).
        avx2: the CPU backend was compiled with AVX2 (the repacked kernels need it).
        avx512: compiled with AVX-512 (16-lane kernels, tiles of up to 8 tokens; else 8 lanes, 3 tokens).
        vnni: compiled with AVX512-VNNI (one vpdpbusd per 64 multiply-adds; else vpmaddubsw + vpmaddwd).
    """

    batch_invariant_mm: bool
    llamafile: bool
    avx2: bool
    avx512: bool = False
    vnni: bool = False

    @property
    def summary(self) -> str:
        """One line for ``speculative doctor``."""
        if self.batch_invariant_mm and self.avx2:
            width = "512-bit, 16 rows x up to 8 tokens per tile" if self.avx512 else "256-bit, 16 rows x up to 3 tokens per tile"
            dot = "vpdpbusd" if self.vnni else "vpmaddubsw + vpmaddwd"
            return (f"repacked batch-invariant kernels (CPU_BIMM) for {', '.join(BIMM_TYPES)} ({width}, {dot}; "
                    f"one fixed order per output for every batch size); other weights: per-pair vec_dot")
        if self.batch_invariant_mm:
            return "batch-invariant build without AVX2: per-pair vec_dot for every type (exact, not faster)"
        return "per-pair vec_dot (exact; a forward over n tokens costs about n single-token forwards)"


def parse_system_info(info: str) -> KernelInfo:
    """Parse llama.cpp's ``llama_print_system_info()`` line ('CPU : AVX2 = 1 | ... |')."""
    flags = {part.split("=")[0].strip() for part in info.replace(":", "|").split("|") if part.strip().endswith("= 1")}
    return KernelInfo("BATCH_INVARIANT_MM" in flags, "LLAMAFILE" in flags, "AVX2" in flags, "AVX512" in flags,
                      "AVX512_VNNI" in flags or "AVX_VNNI" in flags)


def kernel_info() -> KernelInfo:
    """:func:`parse_system_info` of the llama.cpp build this process loads."""
    from .backends.llama_cpp import system_info

    return parse_system_info(system_info())


@dataclass(frozen=True)
class CpuInfo:
    """The processor, as /proc/cpuinfo names it, and its instruction-set class."""

    model: str
    flags: frozenset[str]
    vendor: str = ""
    family: int = -1
    model_number: int = -1

    @property
    def microarchitecture(self) -> str:
        """AMD's core generation from the CPU family and model ('Zen 4'), which a virtual machine's
        model name ('AMD EPYC') leaves out; '' when unknown."""
        if self.vendor != "AuthenticAMD":
            return ""
        f, m = self.family, self.model_number
        if f == 0x17:
            return "Zen 2" if m >= 0x30 else "Zen/Zen+"
        if f == 0x19:
            return "Zen 4" if (0x10 <= m <= 0x1F or 0x60 <= m <= 0x7F or 0xA0 <= m <= 0xAF) else "Zen 3"
        if f == 0x1A:
            return "Zen 5"
        return ""

    @property
    def isa_class(self) -> str:
        """'AVX-512 with VNNI', 'AVX-512 without VNNI', 'AVX2 with AVX-VNNI', 'AVX2 only' or 'no AVX2'."""
        f = self.flags
        if "avx512f" in f and "avx512bw" in f:
            return "AVX-512 with VNNI" if "avx512_vnni" in f else "AVX-512 without VNNI"
        if "avx2" in f:
            return "AVX2 with AVX-VNNI" if "avx_vnni" in f else "AVX2 only"
        return "no AVX2"

    @property
    def summary(self) -> str:
        arch = self.microarchitecture
        return f"{self.model}{' (' + arch + ')' if arch else ''}, {self.isa_class}, {os.cpu_count()} logical CPUs"


@lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """The machine's processor (Linux: /proc/cpuinfo; elsewhere: platform.processor(), no flags)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if not line.strip():
                break  # the first processor is enough
            fields.setdefault(key.strip(), val.strip())
    except OSError:
        pass

    def number(key: str) -> int:
        try:
            return int(fields.get(key, "-1"))
        except ValueError:
            return -1

    return CpuInfo(fields.get("model name") or platform.processor() or platform.machine(),
                   frozenset(fields.get("flags", "").split()), fields.get("vendor_id", ""), number("cpu family"),
                   number("model"))


@lru_cache(maxsize=1)
def _ggml_cpu():
    """libggml-cpu of the build llama-cpp-python loads, or None (ctypes; loading llama_cpp first)."""
    from .backends.llama_cpp import _llama

    _llama()  # loads libggml-cpu into the process
    for name in ("libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll"):
        path = llama_lib_dir() / name
        if path.exists():
            try:
                return ctypes.CDLL(str(path))
            except OSError:
                return None
    return None


def _symbol(name: str, restype, argtypes):
    lib = _ggml_cpu()
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is not None:
        fn.restype, fn.argtypes = restype, argtypes
    return fn


def bimm_isa() -> str | None:
    """The instruction-set family of the build's CPU_BIMM kernels ('AVX512-VNNI', 'AVX512BW', 'AVX2-VNNI',
    'AVX2'), or None (no kernels, or a build without the patch)."""
    fn = _symbol("ggml_bimm_isa", ctypes.c_char_p, [])
    out = fn() if fn is not None else None
    return out.decode() if out else None


def has_batch_invariant_attention() -> bool:
    """Whether the build has the patch's attention kernel (``ggml_bimm_f16_dot``, bimm-f16.c, the seventh
    version on), which exact contexts use for their K/V products; False for older or unpatched builds."""
    lib = _ggml_cpu()
    return lib is not None and getattr(lib, "ggml_bimm_f16_dot", None) is not None


def read_bandwidth(threads: int, nbytes: int = 1 << 30, rounds: int = 5) -> float | None:
    """Bytes per second that ``threads`` threads read from a buffer of ``nbytes`` (far larger than the
    caches), each its own contiguous part with the kernels' vector loads; the median of ``rounds`` passes.
    None without the patched build."""
    fn = _symbol("ggml_bimm_read_bandwidth", ctypes.c_double, [ctypes.c_size_t, ctypes.c_int, ctypes.c_int])
    if fn is None:
        return None
    value = float(fn(nbytes, int(threads), int(rounds)))
    return value if value > 0 else None


def peak_macs(threads: int, seconds: float = 0.5) -> float | None:
    """Integer multiply-adds per second of the kernels' inner instruction, register-blocked: 12 independent
    ``vpdpbusd`` chains per thread with VNNI, 6 chains each adding its own ``vpmaddubsw`` + ``vpmaddwd``
    product without (builds of the patch before its eleventh version timed a loop that went through the
    stack, about half the VNNI figure; docs/kernels.md). ``threads`` threads: the compute bound of a
    forward over many tokens. None without the patched build or its kernels."""
    fn = _symbol("ggml_bimm_peak_macs", ctypes.c_double, [ctypes.c_int, ctypes.c_double])
    if fn is None:
        return None
    value = float(fn(int(threads), float(seconds)))
    return value if value > 0 else None


def patch_key() -> str:
    """First 12 hex digits of the patch's sha256 (part of the set-up's wheel cache key)."""
    return hashlib.sha256(PATCH.read_bytes()).hexdigest()[:12]


def patched_source_dir() -> Path:
    """What ``scripts/setup.sh`` keeps of the patched ggml for the native kernel test: ``include/`` (the
    headers), ``src/`` (internal headers) and ``src/ggml-cpu/bimm.c`` (the kernels, which the test builds
    for each instruction-set family). ``$SPECULATIVE_GGML_SOURCE`` overrides. The folder may be missing
    (set-up not run, or the patch did not apply); callers check."""
    env = os.environ.get("SPECULATIVE_GGML_SOURCE")
    if env:
        return Path(env)
    base = Path(os.environ.get("SPECULATIVE_CACHE_DIR") or Path.home() / ".cache" / "speculative")
    return base / "src" / f"llama-cpp-python-{LLAMA_CPP_VERSION}-bimm-{patch_key()}"


def patched_include_dir() -> Path:
    """The patched ggml headers (``patched_source_dir() / "include"``)."""
    return patched_source_dir() / "include"


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
