"""The benchmark tables of README.md and docs/benchmarks.md are what the committed run files say
(scripts/bench_tables.py), and their intervals are printed so that a bound below 1 never reads as 1.00."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("bench_tables", ROOT / "scripts" / "bench_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docs_tables_match_the_run_files(tables, capsys):
    assert tables.main(["--check"]) == 0, capsys.readouterr().err


def test_a_changed_number_is_caught(tables):
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "<!-- bench-table small-targets -->" in doc
    tampered = doc.replace("1.93x (1.66–2.25)", "1.95x (1.66–2.25)", 1)
    assert tampered != doc
    assert tables.render(tampered)[1] == ["small-targets"]


@pytest.mark.parametrize("x, text", [(0.997, "0.997"), (1.004, "1.004"), (1.0, "1.00"), (0.9996, "1.00"),
                                     (0.95, "0.95"), (1.05, "1.05")])
def test_interval_bounds_do_not_round_onto_1(tables, x, text):
    assert tables.bound(x) == text


def test_the_gate_run_prints_its_lower_bound(tables):
    """The AMD EPYC gate run's n-gram interval, once shown as (1.00–1.05): its lower bound is 0.997."""
    row = next(line for line in tables.TABLES["qwen-gate-epyc"]() if "| ngram |" in line)
    assert "1.02x (0.997–1.05)" in row


def test_the_reference_is_chosen_by_the_recorded_flag_then_by_name(tables):
    """A stock llama-cpp-python (recorded unmodified) may be the reference; our build never is, whatever its
    name; runs older than the flag fall back to the names of llama.cpp's and PyTorch's own decoders."""
    def m(name, speedup, flag=None):
        e = {"method": name, "kind": "peer", "plain": True, "speedup": {"mean": speedup}}
        if flag is not None:
            e["unmodified"] = flag
        return e

    res = {"methods": [m("llama-server", 0.8, True), m("llama-cpp-python (stock)", 0.9, True),
                       m("llama-cpp-python (our build)", 1.2, False)]}
    assert tables.fastest_unmodified_of(res) == "llama-cpp-python (stock)"
    assert tables.label("llama-cpp-python (stock)", res) == "llama-cpp-python (stock, unmodified), fastest"
    old = {"methods": [m("llama-server", 0.8), m("llama-cpp-python", 1.2)]}
    assert tables.fastest_unmodified_of(old) == "llama-server"


def test_the_decode_column_is_the_reports_own_ratio(tables):
    """The decode column compares with the run's fastest unmodified decoder in decoding (the stock
    llama-cpp-python in the seventeenth version's gate, not llama-server, the fastest end to end) and pairs only
    the questions the report counts: every method's cell is the report's own ``vs_fastest_plain`` figure."""
    import json

    run = "qwen-gate-v17-zen4"
    res = json.loads((ROOT / "docs" / "bench" / run / "results.json").read_text())
    assert res["fastest_plain"]["decode"] != res["fastest_plain"]["end_to_end"]
    rows = tables.methods_table([run])[2:]
    assert len(rows) == len(res["methods"])
    for row, m in zip(rows, res["methods"]):
        dec = m["vs_fastest_plain"]["decode_speedup"]
        assert row.split(" | ")[3] == tables.ratio(dec["mean"], *dec["ci95"]), m["method"]
