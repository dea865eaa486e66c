#!/bin/bash
# usage: mutate.sh NAME FILE OLD NEW : libggml-cpu built with one replacement in FILE (under ggml/src/ggml-cpu), the
# kernel harness (tests/native/test_batch_invariant_mm.c --graph) linked against it; its output in NAME.txt here.
# TREE: the patched llama.cpp (default: this machine's); BUILD: its cmake build folder (made with
#   cmake -S $TREE -B $BUILD -DCMAKE_BUILD_TYPE=Release -DGGML_LLAMAFILE=OFF -DGGML_CPU_BATCH_INVARIANT_MM=ON);
# BASE_LIBS: a copy of the venv's llama_cpp/lib, whose libggml-cpu is replaced. BUILD is left holding the mutated
# library: rebuild it (cmake --build $BUILD --target ggml-cpu) before using it for anything else.
set -e
name=$1; file=$2; old=$3; new=$4
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
T=${TREE:-/tmp/avx2/llama_cpp_python-0.3.36/vendor/llama.cpp}
B=${BUILD:-/tmp/nativebuild}
f=$T/ggml/src/ggml-cpu/$file
keep=$(mktemp); cp "$f" "$keep"
trap 'cp "$keep" "$f"; rm -f "$keep"' EXIT  # the tree restored whatever happens
python3 - "$f" "$old" "$new" <<'PY'
import sys
p, old, new = sys.argv[1:]
s = open(p).read(); assert s.count(old) == 1, (old, s.count(old)); open(p, 'w').write(s.replace(old, new))
PY
W=/tmp/mutation-$name; rm -rf "$W"; mkdir -p "$W"
cmake --build "$B" -j2 --target ggml-cpu > "$W/build.log" 2>&1  # a failed build stops here
cp "$keep" "$f"
L=$W/lib; cp -r "${BASE_LIBS:-/tmp/libs-v15f}" "$L"
for x in libggml-cpu.so libggml-cpu.so.0 libggml-cpu.so.0.25.3; do cp "$B/bin/libggml-cpu.so.0.25.3" "$L/$x"; done
src=$T/ggml  # the harness compiled against the same tree as the library
for k in bimm.c bimm-f16.c; do gcc -O2 -std=gnu11 -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -I$src/include -I$src/src -I$src/src/ggml-cpu -c $src/src/ggml-cpu/$k -o $W/$k.o; done
gcc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -I$src/include "$repo/tests/native/test_batch_invariant_mm.c" $W/*.o -L$L -Wl,-rpath,$L -lggml-cpu -lggml-base -lggml -lm -lpthread -o $W/test
out=$here/$name.txt
{ echo "mutation $name: $file: '$old' -> '$new'"; "$W/test" --graph 2>&1 || true; } > "$out"
grep -E 'mismatches: [1-9]|FAILED|OK$' "$out" | head
