// Micro-benchmark of the CPU_BIMM kernels (patches/llama-cpp-batch-invariant.patch) and of the machine
// limits they meet, against the installed build:
//   peak:     integer multiply-adds per second of the kernels' inner instruction (ggml_bimm_peak_macs)
//   bandwidth: bytes per second the threads read from 1 GiB (ggml_bimm_read_bandwidth)
//   compute:  multiply-adds per second of each type's kernels with the weights in cache (each thread
//             256 rows x K, the product repeated 50 times), n = 1, 2, 4, 8, 16 tokens
//   stream:   the same over MB megabytes of weights (far beyond the caches), n = 1, 2, 4, 8
// Weights are on transparent huge pages where THP allows (madvise mode included), like the CPU_BIMM buffer's.
// Every figure is the best of 15 runs (a shared machine only ever slows a run down).
// Usage: bench_bimm [threads=2] [K=1536] [MB=256]

#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-cpu-bimm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

struct job {
    enum ggml_type type;
    int64_t k, g0, ng, n;
    const char * w;
    const char * act;
    size_t arow, gbytes;
    float * dst;
    int64_t rows;
    int reps;
};

static void * run(void * p) {
    struct job * j = p;
    for (int r = 0; r < j->reps; ++r) {
        ggml_bimm_mul(j->type, j->k, j->w + j->g0 * j->gbytes, j->ng, j->act, j->arow, j->n,
                      j->dst + j->g0 * GGML_BIMM_ROWS, (size_t) j->rows);
    }
    return NULL;
}

// multiply-adds per second of `rows` repacked rows against n tokens, `reps` products per run, best of 15
static double rate(enum ggml_type type, int64_t k, const char * wr, int64_t rows, int n, int nth, int reps) {
    const size_t arow = ggml_bimm_act_row_size(type, k);
    float * x = malloc(sizeof(float) * k * n);
    for (int64_t i = 0; i < k * n; ++i) x[i] = frand();
    char * act = aligned_alloc(64, GGML_PAD(arow * n, 64));
    for (int t = 0; t < n; ++t) ggml_bimm_prepare(type, x + t * k, act + t * arow, k);
    float * dst = malloc(sizeof(float) * rows * n);
    double best = 1e30;
    for (int rep = 0; rep < 15; ++rep) {
        pthread_t th[64];
        struct job jb[64];
        const int64_t ng = rows / GGML_BIMM_ROWS;
        const double t0 = now();
        for (int i = 0; i < nth; ++i) {
            jb[i] = (struct job) { type, k, ng * i / nth, ng * (i + 1) / nth - ng * i / nth, n, wr, act, arow,
                                   ggml_row_size(type, k) * GGML_BIMM_ROWS, dst, rows, reps };
            pthread_create(&th[i], NULL, run, &jb[i]);
        }
        for (int i = 0; i < nth; ++i) pthread_join(th[i], NULL);
        const double t = (now() - t0) / reps;
        best = t < best ? t : best;
    }
    free(x);
    free(act);
    free(dst);
    return (double) rows * k * n / best;
}

// `rows` random rows of `type`, repacked (one quantized 256-row chunk, copied: quantizing is slow)
static char * weights(enum ggml_type type, int64_t k, int64_t rows) {
    const size_t rb = ggml_row_size(type, k);
    float * wf = malloc(sizeof(float) * k * 256);
    for (int64_t i = 0; i < k * 256; ++i) wf[i] = frand();
    char * wq = malloc(rb * rows);
    ggml_quantize_chunk(type, wf, wq, 0, 256, k, NULL);
    for (int64_t r = 256; r < rows; r += 256) memcpy(wq + r * rb, wq, 256 * rb);
    // on transparent huge pages where the kernel allows them, as the CPU_BIMM buffer's weights are (advised before
    // they are written; GGML_CPU_BIMM_HUGEPAGES=0 leaves them on 4 KiB pages, as before 2026-12-06)
    const size_t bytes = GGML_PAD(rb * rows, 2 << 20);
    char * wr = aligned_alloc(2 << 20, bytes);
    ggml_bimm_advise_huge_pages(wr, bytes);
    ggml_bimm_repack(type, wr, wq, rows, k);
    free(wq);
    free(wf);
    return wr;
}

int main(int argc, char ** argv) {
    ggml_cpu_init();
    const int nth = argc > 1 ? atoi(argv[1]) : 2;
    const int64_t k = argc > 2 ? atoll(argv[2]) : 1536;
    const int64_t mb = argc > 3 ? atoll(argv[3]) : 256;
    const char * isa = ggml_bimm_isa();
    if (!isa) {
        printf("this build has no BIMM kernels\n");
        return 1;
    }
    printf("kernels %s, %d threads, K = %lld\n", isa, nth, (long long) k);
    printf("peak: %.0f GMAC/s\n", ggml_bimm_peak_macs(nth, 1.0) / 1e9);
    printf("bandwidth: %.1f GB/s\n", ggml_bimm_read_bandwidth((size_t) 1 << 30, nth, 7) / 1e9);
    const enum ggml_type types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_1 };
    for (int ti = 0; ti < 5; ++ti) {
        const enum ggml_type type = types[ti];
        if (!ggml_bimm_supports(type, k, 256)) continue;
        const int64_t small = 256 * nth;
        char * w = weights(type, k, small);
        printf("%-5s compute (in cache):", ggml_type_name(type));
        for (int n = 1; n <= 16; n *= 2) printf("  n=%d %.0f GMAC/s", n, rate(type, k, w, small, n, nth, 50) / 1e9);
        printf("\n");
        free(w);
        const size_t rb = ggml_row_size(type, k);
        const int64_t big = ((mb << 20) / (int64_t) rb) / 256 * 256;
        w = weights(type, k, big);
        printf("%-5s stream (%lld MB):", ggml_type_name(type), (long long) mb);
        for (int n = 1; n <= 8; n *= 2) {
            const double r = rate(type, k, w, big, n, nth, 1);
            printf("  n=%d %.0f GMAC/s %.1f GB/s", n, r / 1e9, r / n / k * rb / 1e9);
        }
        printf("\n");
        free(w);
    }
    return 0;
}
