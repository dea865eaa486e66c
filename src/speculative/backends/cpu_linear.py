"""Flat verification cost for the transformers backend on CPUs where ``F.linear`` is slow at a few rows.

Speculative decoding pays only when the target scores k+1 tokens for about the cost of one
(Leviathan et al. 2023, section 3.4; Chen et al. 2023, section 2): a linear layer over a few
rows must cost what reading its weight once costs. PyTorch's CPU ``F.linear(x, W)`` computes
``x @ W.T`` through the BLAS (MKL in the PyPI wheels), and on some CPUs that call handles a few
rows as nearly separate passes over ``W``. Measured on an AMD EPYC (Zen 3, AVX2, 2 threads),
fp32, W of 8960 x 1536: one row 4.9 ms (the memory bound), 2 rows 9.8 ms, 4 rows 15.8 ms, 8 rows
22.7 ms; the same product asked as ``(W @ x.T).T`` takes 4.4, 6.3 and 9.8 ms for 2, 4 and 8
rows, and is faster up to 400 rows (prefill) too. For Qwen2.5-Coder-1.5B this turns the
verification cost T(2) from 2.1 T(1) into 1.13 T(1) (T(4) 1.19 T(1)).

:func:`choose` measures both forms once per machine, PyTorch version, dtype, thread count and
weight shape (cached under ``<cache>/cpu-linear/``) and :func:`install` routes the model's
``nn.Linear`` layers of each shape through the faster one for inputs of two or more rows.
Single-row inputs, that is plain decoding, always keep ``F.linear``. Outputs stay fp32 products of the same
numbers; the summation order differs from ``F.linear``'s by about 1e-5 in a logit, the same
size as PyTorch's own batch-size dependence (the backend is batch-variant either way).

``SPECULATIVE_CPU_LINEAR`` = ``auto`` (default), ``transposed`` or ``torch`` forces a form.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

from ..cache import cache_dir, read_json, write_json_atomic
from ..errors import ConfigError

FORMS = ("auto", "transposed", "torch")
ENV = "SPECULATIVE_CPU_LINEAR"
#: the transposed form is used when it takes at most this fraction of F.linear's time
GAIN = 0.85
#: rows timed when choosing (a typical verification batch, k + 1)
CALIBRATION_ROWS = (2, 4, 8)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _transposed_linear(module):
    """``module.forward`` computing ``(W @ x.T).T + b`` for inputs of several rows."""
    import torch
    import torch.nn.functional as F

    def forward(x):
        if x.numel() == x.shape[-1]:  # one row: plain decoding keeps F.linear
            return F.linear(x, module.weight, module.bias)
        y = torch.mm(module.weight, x.reshape(-1, x.shape[-1]).t()).t()
        if module.bias is not None:
            y = y + module.bias
        return y.reshape(*x.shape[:-1], y.shape[-1]).contiguous()

    return forward


def _time_ms(fn) -> float:
    """Milliseconds of one call of ``fn`` after a warm-up call."""
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def measure(weight, rows=CALIBRATION_ROWS, reps: int | None = None) -> dict[int, tuple[float, float]]:
    """Median milliseconds of ``F.linear`` and of the transposed form, per row count.

    Args:
        weight: a 2-D CPU tensor (out_features x in_features).
        rows: row counts to time.
        reps: timed repetitions per form and row count (forms alternate); default 5, 3 for
            weights over 256 MiB (an output head over a large vocabulary).

    Returns:
        {rows: (torch_ms, transposed_ms)}.
    """
    import torch
    import torch.nn.functional as F

    if reps is None:
        reps = 3 if weight.numel() * weight.element_size() > 256 << 20 else 5
    out = {}
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for n in rows:
            x = torch.randn(n, weight.shape[1], generator=g, dtype=weight.dtype)
            a, b = [], []
            for _ in range(reps):
                a.append(_time_ms(lambda: F.linear(x, weight)))
                b.append(_time_ms(lambda: torch.mm(weight, x.t()).t().contiguous()))
            out[int(n)] = (statistics.median(a), statistics.median(b))
    return out


def choose(weight, form: str | None = None) -> str:
    """``"transposed"`` or ``"torch"`` for linear layers shaped like ``weight`` on this machine.

    Args:
        weight: a linear layer's weight (2-D CPU tensor).
        form: "auto", "transposed" or "torch"; default ``$SPECULATIVE_CPU_LINEAR`` or "auto".

    Raises:
        ConfigError: an unknown form.
    """
    import torch

    form = form or os.environ.get(ENV) or "auto"
    if form not in FORMS:
        raise ConfigError(f"{ENV} must be one of {', '.join(FORMS)}, got {form!r}")
    if form != "auto":
        return form
    key = "|".join([_cpu_name(), torch.__version__, str(weight.dtype), f"threads={torch.get_num_threads()}",
                    "x".join(str(d) for d in weight.shape)])
    path = cache_dir("cpu-linear") / "choices.json"
    known = read_json(path)
    if key in known:
        return known[key]["form"]
    times = measure(weight)
    faster = all(t <= GAIN * f for f, t in times.values())
    choice = "transposed" if faster else "torch"
    known[key] = {"form": choice, "ms": {str(n): [round(f, 3), round(t, 3)] for n, (f, t) in times.items()}}
    write_json_atomic(path, known)
    return choice


def summary() -> str:
    """One line for ``speculative doctor``: the forced form, or what "auto" chose on this machine so far."""
    form = os.environ.get(ENV) or "auto"
    if form != "auto":
        return f"{form} (forced by {ENV})"
    cpu = _cpu_name()
    known = [v for k, v in read_json(cache_dir("cpu-linear") / "choices.json").items() if k.startswith(cpu + "|")]
    if not known:
        return "auto (measured on the first model load)"
    n = sum(v.get("form") == "transposed" for v in known)
    return f"auto: (W @ x.T).T for {n} of {len(known)} measured layer shapes, F.linear for the rest"


def install(model, form: str | None = None) -> str:
    """Route ``model``'s ``nn.Linear`` layers through the faster CPU form, chosen per weight shape.

    Only layers of type exactly ``torch.nn.Linear`` on the CPU change (quantized or custom layers
    keep theirs). Small layers that fit in cache may keep ``F.linear`` while the large ones (the
    MLP, the output head) change.

    Returns:
        "transposed" when every layer uses it, "torch" when none does, else "mixed".
    """
    import torch

    layers = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"]
    by_shape: dict[tuple, list] = {}
    for m in layers:
        by_shape.setdefault((tuple(m.weight.shape), m.weight.dtype), []).append(m)
    used = set()
    for group in by_shape.values():
        choice = choose(group[0].weight.detach(), form)
        used.add(choice)
        if choice == "transposed":
            for m in group:
                m.forward = _transposed_linear(m)
    if not used:
        return "torch"
    return used.pop() if len(used) == 1 else "mixed"
