// ggml_bimm_f16_dot alone on one of attention's shapes, one thread, data in cache: the best of 5 timings of CALLS
// calls (f16_block_bench.sh builds and runs it). Usage: f16_block_bench N ROWS COLUMNS CALLS [ROW_STRIDE]
// Prints the time per call and the rate in 16-lane fused multiply-adds (ROWS x COLUMNS x ceil(N / 16) per call).
// f16_block_bench peak: the core's rate of independent 16-lane float FMAs (12 chains in registers, AVX-512 only).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ggml.h"

#if defined(__AVX512F__)
#    include <immintrin.h>
#endif

void ggml_bimm_f16_dot(int64_t n, int64_t nr, int64_t nc, const ggml_fp16_t * x, size_t bx,
                       const ggml_fp16_t * const * y, float * const * dst);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int peak(void) {
#if defined(__AVX512F__)
    const long calls = 100000000;
    __m512     a0 = _mm512_set1_ps(0.10f), a1 = _mm512_set1_ps(0.11f), a2 = _mm512_set1_ps(0.12f),
           a3 = _mm512_set1_ps(0.13f), a4 = _mm512_set1_ps(0.14f), a5 = _mm512_set1_ps(0.15f),
           a6 = _mm512_set1_ps(0.16f), a7 = _mm512_set1_ps(0.17f), a8 = _mm512_set1_ps(0.18f),
           a9 = _mm512_set1_ps(0.19f), a10 = _mm512_set1_ps(0.20f), a11 = _mm512_set1_ps(0.21f);
    const __m512 m = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(0.0001f);
    double       best = 1e9;
    for (int t = 0; t < 3; t++) {
        const double t0 = now();
        for (long i = 0; i < calls; i++) {
#    define F(x) x = _mm512_fmadd_ps(x, m, c);
            F(a0) F(a1) F(a2) F(a3) F(a4) F(a5) F(a6) F(a7) F(a8) F(a9) F(a10) F(a11)
#    undef F
            __asm__ volatile("" ::"v"(a0), "v"(a1), "v"(a2), "v"(a3), "v"(a4), "v"(a5), "v"(a6), "v"(a7), "v"(a8),
                             "v"(a9), "v"(a10), "v"(a11));
        }
        const double dt = now() - t0;
        best            = dt < best ? dt : best;
    }
    printf("peak: %.2f G 16-lane FMA/s\n", 12.0 * calls / best / 1e9);
    return 0;
#else
    fprintf(stderr, "peak: needs an AVX-512 build\n");
    return 2;
#endif
}

int main(int argc, char ** argv) {
    if (argc == 2 && argv[1][0] == 'p') {
        return peak();
    }
    if (argc < 5) {
        fprintf(stderr, "usage: %s N ROWS COLUMNS CALLS [ROW_STRIDE]\n", argv[0]);
        return 2;
    }
    const int    n = atoi(argv[1]), nr = atoi(argv[2]), nc = atoi(argv[3]), calls = atoi(argv[4]);
    const size_t bx = argc > 5 ? (size_t) atoi(argv[5]) : (size_t) n;
    if (n < 1 || nr < 1 || nc < 1 || nc > 64 || calls < 1 || bx < (size_t) n) {
        fprintf(stderr, "bad shape\n");
        return 2;
    }
    ggml_fp16_t * x   = malloc(sizeof(ggml_fp16_t) * bx * nr);
    ggml_fp16_t * ys  = malloc(sizeof(ggml_fp16_t) * (size_t) n * nc);
    float *       out = malloc(sizeof(float) * (size_t) nr * nc);
    for (size_t i = 0; i < bx * nr; i++) {
        x[i] = ggml_fp32_to_fp16((float) ((i * 37) % 101) / 101.0f - 0.5f);
    }
    for (size_t i = 0; i < (size_t) n * nc; i++) {
        ys[i] = ggml_fp32_to_fp16((float) ((i * 53) % 97) / 97.0f - 0.5f);
    }
    const ggml_fp16_t * y[64];
    float *             dst[64];
    for (int c = 0; c < nc; c++) {
        y[c]   = ys + (size_t) c * n;
        dst[c] = out + (size_t) c * nr;
    }
    double best = 1e9;
    for (int t = 0; t < 5; t++) {
        const double t0 = now();
        for (int r = 0; r < calls; r++) {
            ggml_bimm_f16_dot(n, nr, nc, x, bx, y, dst);
        }
        const double dt = (now() - t0) / calls;
        best            = dt < best ? dt : best;
    }
    const double fmas = (double) nr * nc * ((n + 15) / 16);
    printf("n=%d rows=%d columns=%d: %.2f us per call, %.2f G 16-lane FMA/s\n", n, nr, nc, best * 1e6, fmas / best / 1e9);
    free(x);
    free(ys);
    free(out);
    return 0;
}
