#!/usr/bin/env bash
# ggml_bimm_f16_dot alone, one thread, data in cache: the sixteenth version's bimm-f16.c (from the patch at commit
# 9fd1965) against the working tree's patch, each compiled with f16_block_bench.c, alternating, on attention's
# shapes of the two Qwen models (context 600). Usage, from the repository root after scripts/setup.sh:
#   bash docs/bench/attention-blocks-zen4/f16_block_bench.sh [ROUNDS] [avx2]
# (avx2: both built for AVX2 without AVX-512, -march=x86-64-v3, as the AVX2-only machines' builds run them)
set -euo pipefail
rounds=${1:-3}
here=$(cd "$(dirname "$0")" && pwd)
src=$(.venv/bin/python -c 'from speculative.kernels import patched_source_dir; print(patched_source_dir())')
lib=$(.venv/bin/python -c 'from speculative.kernels import llama_lib_dir; print(llama_lib_dir())')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
extract() {  # the new file bimm-f16.c from a patch text on stdin
  python3 -c '
import sys
p = sys.stdin.read()
i = p.index("diff --git a/ggml/src/ggml-cpu/bimm-f16.c")
j = p.find("\ndiff --git", i + 10)
sec = p[i:j if j > 0 else len(p)]
body = sec[sec.index("\n@@") + 1:].split("\n")[1:]
sys.stdout.write("".join(l[1:] + "\n" for l in body if l.startswith("+")))'
}
git show 9fd1965:patches/llama-cpp-batch-invariant.patch | extract > "$work/v16.c"
extract < patches/llama-cpp-batch-invariant.patch > "$work/new.c"
flags=(-O2 -std=gnu11 -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
if [ "${2:-}" = avx2 ]; then
  flags=(-O2 -std=gnu11 -march=x86-64-v3 -mno-avxvnni)
fi
for v in v16 new; do
  cc "${flags[@]}" -I"$src/include" -I"$src/src" -I"$src/src/ggml-cpu" -c "$work/$v.c" -o "$work/$v.o"
  cc "${flags[@]}" -I"$src/include" "$here/f16_block_bench.c" "$work/$v.o" -L"$lib" -Wl,-rpath,"$lib" \
    -lggml-cpu -lggml-base -lggml -lm -lpthread -o "$work/bench-$v"
done
# n (dot length) nr (rows) nc (columns) calls [row stride]: K products (head dim x context), V products (context
# x head dim, rows a 4096-cell cache apart); columns: the query heads of one K/V head for 1 token (6 on the 1.5B,
# 7 on the 0.5B) and a call's 16 columns of an 8-token forward
shapes=("128 600 6 2000" "128 600 16 1000" "600 128 6 2000 4096" "600 128 16 1000 4096"
        "64 600 7 2000" "64 600 16 1000" "600 64 7 2000 4096" "600 64 16 1000 4096")
if [ "${2:-}" != avx2 ]; then
  "$work/bench-new" peak
fi
for r in $(seq "$rounds"); do
  for s in "${shapes[@]}"; do
    for v in v16 new; do
      # shellcheck disable=SC2086
      echo "round $r $v $("$work/bench-$v" $s)"
    done
  done
done
