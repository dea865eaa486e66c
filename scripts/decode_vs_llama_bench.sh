#!/bin/bash
# Interleaved rounds: llama.cpp's unmodified default build (llama-bench from scripts/build-llama-tools.sh)
# against our exact kernels (speculative profile), single-token decoding and 512-token prefill after a
# 600-token context, 2 threads. Writes one JSON line per measurement to OUT (docs/kernels.md), or to
# standard output without OUT; OUT appears only when every round has finished.
#   bash scripts/decode_vs_llama_bench.sh MODEL [ROUNDS [OUT]]     (ROUNDS: 4 by default)
# Other builds: LLAMA_TOOLS_BIN=DIR picks the llama-bench (PEER_NAME names it in the output);
# LLAMA_CPP_LIB_PATH=DIR picks our library (e.g. an AVX2-only build of the patched llama.cpp).
set -euo pipefail
usage() { echo "usage: bash scripts/decode_vs_llama_bench.sh MODEL [ROUNDS [OUT]]  (e.g. qwen2.5-coder-1.5b-instruct 4 out.jsonl)" >&2; exit 2; }
[[ $# -ge 1 && $# -le 3 && $1 != -* ]] || usage
MODEL=$1; ROUNDS=${2:-4}; OUT=${3:-}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "error: ROUNDS must be a positive whole number, got '$ROUNDS'" >&2; exit 2; }
if [[ -n $OUT && ! -d $(dirname -- "$OUT") ]]; then echo "error: OUT $OUT: its folder does not exist" >&2; exit 2; fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="$ROOT/.venv/bin/python"
[[ -x $PY ]] || { echo "error: no $PY: run 'bash scripts/setup.sh' first" >&2; exit 2; }
GGUF=$("$PY" - "$MODEL" <<'PYEOF'
import sys
from speculative.errors import SpeculativeError
from speculative.models import resolve
try:
    print(resolve(sys.argv[1]).location)
except SpeculativeError as e:
    sys.exit(f"error: {e}")
PYEOF
)
BIN=${LLAMA_TOOLS_BIN:-$(bash "$ROOT/scripts/build-llama-tools.sh" | tail -1)}
PEER_NAME=${PEER_NAME:-llama-bench (llama.cpp default build)}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
RES="$TMP/out.jsonl"; : > "$RES"
for r in $(seq 1 "$ROUNDS"); do
  # llama.cpp: tg64 (64 single-token steps after the context) and pp512, one repetition each
  "$BIN/llama-bench" -m "$GGUF" -t 2 -p 512 -n 64 -d 600 -r 1 -o jsonl 2> "$TMP/err" > "$TMP/peer.jsonl" \
    || { echo "error: llama-bench failed: $(tail -1 "$TMP/err")" >&2; exit 1; }
  PEER_NAME=$PEER_NAME ROUND=$r "$PY" -c "
import json, os, sys
for line in open(sys.argv[1]):
    print(json.dumps({'round': int(os.environ['ROUND']), 'peer': os.environ['PEER_NAME'], **json.loads(line)}))
" "$TMP/peer.jsonl" >> "$RES"
  # ours: the median of 64 single-token forwards, then 3 forwards of 512 tokens (separate processes)
  for sizes in "1 64" "512 3"; do
    set -- $sizes
    "$ROOT/.venv/bin/speculative" profile --target "$MODEL" --sizes "$1" --rounds 1 --repeats "$2" --threads 2 \
      -o "$TMP/p.json" > /dev/null 2> "$TMP/err" \
      || { echo "error: speculative profile failed: $(tail -1 "$TMP/err")" >&2; exit 1; }
    ROUND=$r "$PY" -c "import json, os, sys; print(json.dumps({'round': int(os.environ['ROUND']), 'peer': 'speculative profile (exact)', 'profile': json.load(open(sys.argv[1]))}))" "$TMP/p.json" >> "$RES"
  done
done
if [[ -n $OUT ]]; then mv "$RES" "$OUT"; else cat "$RES"; fi
