#!/bin/bash
# The multiply-add peak of each instruction-set family this Xeon runs, the eleventh version's bimm.c
# (ggml_bimm_peak_macs: register-blocked) against the tenth's, each built stand-alone into bench_bimm
# (whose kernels then take precedence over the library's); 1 and 2 threads, 3 alternations.
set -e
S=$1; OLD=$2; NEW=$3; L=$4; OUT=$5   # patched tree (headers), tenth's bimm.c, eleventh's, lib folder, out dir
mkdir -p $OUT/build
for fam in "avx512-vnni:-march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
           "avx512bw:-march=native -mno-avx512vnni -mno-avxvnni -mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
           "avx2-vnni:-march=x86-64-v3 -mavxvnni" "avx2:-march=x86-64-v3 -mno-avxvnni"; do
  n=${fam%%:*}; f=${fam#*:}
  for v in old new; do src=$OLD; [ $v = new ] && src=$NEW
    gcc -O3 -std=gnu11 $f -I$S/include -I$S/src -I$S/src/ggml-cpu -c $src -o $OUT/build/$n-$v.o
    gcc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -I$S/include tests/native/bench_bimm.c $OUT/build/$n-$v.o -L$L -Wl,-rpath,$L \
        -lggml-cpu -lggml-base -lggml -lm -lpthread -o $OUT/build/$n-$v
  done
done
for r in 1 2 3; do for fam in avx512-vnni avx512bw avx2-vnni avx2; do for v in old new; do for th in 1 2; do
  echo "round $r $fam $v threads $th: $($OUT/build/$fam-$v $th 256 1 | sed -n 1,2p | tr '\n' ' ')"
done; done; done; done
