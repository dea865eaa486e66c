#!/bin/bash
# Tightly alternating forward loops of two builds, one model and size at a time (scripts/forward_loop.py,
# SECONDS each, 600 tokens of context, exact numerics, 2 threads), so that each round's pair runs within
# seconds of each other. Usage: bash docs/bench/private-prep-zen4/pairs.sh LIBS_A LIBS_B ROUNDS MODEL N SECONDS
A=$1; B=$2; R=$3; M=$4; N=$5; S=$6
for r in $(seq 1 "$R"); do
  for b in A B; do
    lib=$A; [ $b = B ] && lib=$B
    echo "== round $r build $b"
    LLAMA_CPP_LIB_PATH=$lib .venv/bin/python scripts/forward_loop.py "$M" "$N" "$S"
  done
done
