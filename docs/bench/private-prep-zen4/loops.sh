#!/bin/bash
# Alternating single-token forward loops of two builds (scripts/forward_loop.py: 20 s each, 600 tokens of
# context, exact numerics, 2 threads; it prints the median and the fastest forward).
# Usage: bash docs/bench/private-prep-zen4/loops.sh LIBS_A LIBS_B ROUNDS N MODEL... > loops.txt
A=$1; B=$2; R=$3; N=$4; shift 4
for r in $(seq 1 "$R"); do
  for m in "$@"; do
    for b in A B; do
      lib=$A; [ $b = B ] && lib=$B
      echo "== round $r model $m build $b n $N"
      LLAMA_CPP_LIB_PATH=$lib .venv/bin/python scripts/forward_loop.py "$m" "$N" 20
    done
  done
done
