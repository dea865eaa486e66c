#!/bin/bash
# Interleaved rounds: llama.cpp's unmodified default build (llama-bench from scripts/build-llama-tools.sh)
# against our exact kernels (speculative profile), single-token decoding and 512-token prefill after a
# 600-token context, 2 threads. Writes one JSON line per measurement to OUT (docs/kernels.md).
#   bash scripts/decode_vs_llama_bench.sh MODEL ROUNDS OUT
# Other builds: LLAMA_TOOLS_BIN=DIR picks the llama-bench (PEER_NAME names it in the output);
# LLAMA_CPP_LIB_PATH=DIR picks our library (e.g. an AVX2-only build of the patched llama.cpp).
set -euo pipefail
MODEL=${1:-qwen2.5-coder-1.5b-instruct}; ROUNDS=${2:-4}; OUT=${3:-/dev/stdout}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${LLAMA_TOOLS_BIN:-$(bash "$ROOT/scripts/build-llama-tools.sh" | tail -1)}
PEER_NAME=${PEER_NAME:-llama-bench (llama.cpp default build)}
GGUF=$("$ROOT/.venv/bin/python" -c "from speculative.models import resolve; print(resolve('$MODEL').location)")
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
: > "$OUT.tmp"
for r in $(seq 1 "$ROUNDS"); do
  # llama.cpp: tg64 (64 single-token steps after the context) and pp512, one repetition each
  "$BIN/llama-bench" -m "$GGUF" -t 2 -p 512 -n 64 -d 600 -r 1 -o jsonl 2>/dev/null \
    | sed "s/^{/{\"round\": $r, \"peer\": \"$PEER_NAME\", /" >> "$OUT.tmp"
  # ours: the median of 64 single-token forwards, then 3 forwards of 512 tokens (separate processes)
  for sizes in "1 64" "512 3"; do
    set -- $sizes
    "$ROOT/.venv/bin/speculative" profile --target "$MODEL" --sizes "$1" --rounds 1 --repeats "$2" --threads 2 \
      -o "$TMP/p.json" > /dev/null 2>&1
    "$ROOT/.venv/bin/python" -c "import json; d=json.load(open('$TMP/p.json')); print(json.dumps({'round': $r, 'peer': 'speculative profile (exact)', 'profile': d}))" >> "$OUT.tmp"
  done
done
mv "$OUT.tmp" "$OUT"
