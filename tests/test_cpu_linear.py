"""The transformers backend's CPU linear forms (speculative.backends.cpu_linear), on small layers."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from speculative.backends import cpu_linear  # noqa: E402
from speculative.errors import ConfigError  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECULATIVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(cpu_linear.ENV, raising=False)
    return tmp_path


class ThreeLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Linear(48, 96)
        self.b = torch.nn.Linear(96, 40, bias=False)
        self.head = torch.nn.Linear(40, 300, bias=False)
        for p in self.parameters():  # unit-scale activations, so fp32 rounding stays ~1e-6
            p.data = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5

    def forward(self, x):
        return self.head(self.b(torch.relu(self.a(x))))


@pytest.mark.parametrize("shape", [(1, 48), (1, 1, 48), (5, 48), (1, 7, 48), (3, 4, 48)])
def test_transposed_form_computes_the_linear_layer(cache, shape):
    ref, m = ThreeLayers(), ThreeLayers()
    assert cpu_linear.install(m, "transposed") == "transposed"
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want, got = ref(x), m(x)
    assert got.shape == want.shape and got.is_contiguous()
    if x.numel() == 48:  # one row: F.linear itself, bit for bit (plain decoding is untouched)
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_torch_form_leaves_the_layers_alone(cache):
    m = ThreeLayers()
    before = {name: mod.forward for name, mod in m.named_modules()}
    assert cpu_linear.install(m, "torch") == "torch"
    assert all(mod.forward == before[name] for name, mod in m.named_modules())


FAST = {2: (10.0, 4.0), 4: (16.0, 5.0), 8: (20.0, 8.0)}
SLOW = {2: (10.0, 4.0), 4: (16.0, 5.0), 8: (20.0, 19.0)}  # no gain at 8 rows


def test_auto_measures_each_shape_once_and_caches_the_choice(cache, monkeypatch):
    calls = []

    def fake_measure(weight, *a, **kw):
        calls.append(tuple(weight.shape))
        return FAST

    monkeypatch.setattr(cpu_linear, "measure", fake_measure)
    assert cpu_linear.install(ThreeLayers()) == "transposed"
    assert cpu_linear.install(ThreeLayers()) == "transposed"
    assert sorted(calls) == [(40, 96), (96, 48), (300, 40)]  # one measurement per weight shape, ever
    saved = json.loads((cache / "cpu-linear" / "choices.json").read_text())
    assert len(saved) == 3 and all(v["form"] == "transposed" and v["ms"]["4"] == [16.0, 5.0] for v in saved.values())


def test_auto_keeps_torch_unless_every_size_gains(cache, monkeypatch):
    monkeypatch.setattr(cpu_linear, "measure", lambda w, *a, **k: SLOW)
    m = ThreeLayers()
    before = m.head.forward
    assert cpu_linear.install(m) == "torch"
    assert m.head.forward == before


def test_auto_decides_per_shape(cache, monkeypatch):
    # only the largest weight (the output head here) gains: it alone changes
    monkeypatch.setattr(cpu_linear, "measure", lambda w, *a, **k: FAST if w.shape[0] == 300 else SLOW)
    ref, m = ThreeLayers(), ThreeLayers()
    before_a, before_head = m.a.forward, m.head.forward
    assert cpu_linear.install(m) == "mixed"
    assert m.a.forward == before_a and m.head.forward != before_head
    x = torch.randn(3, 48)
    with torch.inference_mode():
        torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-5)


def test_environment_forces_a_form_and_rejects_unknown_ones(cache, monkeypatch):
    monkeypatch.setattr(cpu_linear, "measure", lambda *a, **k: pytest.fail("a forced form must not measure"))
    monkeypatch.setenv(cpu_linear.ENV, "transposed")
    assert cpu_linear.install(ThreeLayers()) == "transposed"
    monkeypatch.setenv(cpu_linear.ENV, "fast")
    with pytest.raises(ConfigError, match="SPECULATIVE_CPU_LINEAR must be one of auto, transposed, torch"):
        cpu_linear.install(ThreeLayers())


def test_measure_times_both_forms(cache, monkeypatch):
    """measure() times F.linear and the transposed form alternately, reps times each per row count, on the
    same product x·Wᵀ, and reports (F.linear's median, the transposed form's median) in milliseconds."""
    w = torch.randn(64, 32)
    products = []
    fake_ms = iter([5.0, 1.0, 7.0, 2.0, 100.0, 3.0] * 2)  # per row count: F.linear, transposed, alternating

    def timed(fn):
        products.append(fn())
        return next(fake_ms)

    monkeypatch.setattr(cpu_linear, "_time_ms", timed)
    times = cpu_linear.measure(w, rows=(2, 3), reps=3)
    assert times == {2: (7.0, 2.0), 3: (7.0, 2.0)}  # medians of (5, 7, 100) and of (1, 2, 3)
    assert [p.shape for p in products] == [(2, 64)] * 6 + [(3, 64)] * 6
    for a, b in zip(products[0::2], products[1::2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # both forms compute the same x·Wᵀ


def test_summary_for_doctor(cache, monkeypatch):
    assert cpu_linear.summary() == "auto (measured on the first model load)"
    monkeypatch.setattr(cpu_linear, "measure", lambda w, *a, **k: FAST if w.shape[0] == 300 else SLOW)
    cpu_linear.install(ThreeLayers())
    assert cpu_linear.summary() == "auto: (W @ x.T).T for 1 of 3 measured layer shapes, F.linear for the rest"
    monkeypatch.setenv(cpu_linear.ENV, "torch")
    assert cpu_linear.summary() == "torch (forced by SPECULATIVE_CPU_LINEAR)"
