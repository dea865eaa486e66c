#!/bin/bash
# usage: mutate.sh NAME FILE OLD NEW : build libggml-cpu with one replacement, run the harness --graph against it
# BASE_LIBS: the library folder whose libggml-cpu is replaced (default /tmp/libs-v14c; only libggml-cpu differs between versions)
set -e
name=$1; file=$2; old=$3; new=$4
T=/tmp/sym/pr/llama_cpp_python-0.3.36/vendor/llama.cpp
f=$T/ggml/src/ggml-cpu/$file
cp $f /tmp/$file.keep
trap 'cp /tmp/$file.keep $f' EXIT  # the tree restored whatever happens
python3 - "$f" "$old" "$new" <<'PY'
import sys
p, old, new = sys.argv[1:]
s = open(p).read(); assert s.count(old) == 1, (old, s.count(old)); open(p, 'w').write(s.replace(old, new))
PY
(cd $T && cmake --build build -j2 --target ggml-cpu > /tmp/v14/build-$name.log 2>&1)  # a failed build stops here
cp /tmp/$file.keep $f
L=/tmp/v14/libs-mut-$name; rm -rf $L; cp -r ${BASE_LIBS:-/tmp/libs-v14c} $L
for x in libggml-cpu.so libggml-cpu.so.0 libggml-cpu.so.0.25.3; do cp $T/build/bin/libggml-cpu.so.0.25.3 $L/$x; done

src=$T/ggml  # the harness compiled against the same tree as the library
W=/tmp/v14/w-$name; rm -rf $W; mkdir -p $W
for k in bimm.c bimm-f16.c; do gcc -O2 -std=gnu11 -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -I$src/include -I$src/src -I$src/src/ggml-cpu -c $src/src/ggml-cpu/$k -o $W/$k.o; done
gcc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -I$src/include /work/main/tests/native/test_batch_invariant_mm.c $W/*.o -L$L -Wl,-rpath,$L -lggml-cpu -lggml-base -lggml -lm -lpthread -o $W/test
$W/test --graph > /work/main/docs/bench/single-token-ops-xeon/mutations/$name.txt 2>&1 || true
echo "mutation $name: $file: '$old' -> '$new'" | cat - /work/main/docs/bench/single-token-ops-xeon/mutations/$name.txt > /work/main/docs/bench/single-token-ops-xeon/mutations/$name.tmp && mv /work/main/docs/bench/single-token-ops-xeon/mutations/$name.tmp /work/main/docs/bench/single-token-ops-xeon/mutations/$name.txt
grep -E 'mismatches: [1-9]|FAILED|OK$' /work/main/docs/bench/single-token-ops-xeon/mutations/$name.txt | head
