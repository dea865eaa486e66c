"""T(1), T(8), read bandwidth and T(1) over the weight-read time of `speculative profile` files, per folder and model.

Usage: python3 goal_table.py FOLDER... (files MODEL-runN.json)"""
import glob
import json
import statistics
import sys

for folder in sys.argv[1:]:
    for m in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
        files = sorted(glob.glob(f"{folder}/{m}-run*.json"))
        if not files:
            continue
        ratios = []
        for f in files:
            d = json.load(open(f))
            ratios.append(d["t1_over_weight_read"])
            print(f"{f}: T(1) {d['t_ms']['1']:.1f} ms, T(8) {d['t_ms']['8']:.1f} ms (T(8)/T(1) {d['ratio_to_t1']['8']:.2f}), "
                  f"read {d['bandwidth_median_bytes_per_s'] / 1e9:.1f} GB/s, weights {d['weight_read_ms']:.1f} ms, "
                  f"T(1)/read {d['t1_over_weight_read']:.3f}")
        print(f"{folder} {m}: T(1)/read median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f} "
              f"({len(ratios)} runs)\n")
