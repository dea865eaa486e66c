// Micro-benchmark of ggml-cpu's quantized dot products, one thread, data in cache:
// nanoseconds per (weight row, token) for vec_dot one pair at a time (today's exact path),
// for vec_dot_multi over n tokens, one weight row at a time, and for vec_dot_multi_rows over
// 16 weight rows x n tokens (both GGML_CPU_BATCH_INVARIANT_MM), at one row length k.
// The variants are timed in short interleaved rounds and the minimum over the rounds is kept,
// so that a busy machine slows all of them alike.
//   cc -O2 -I<ggml>/include bench_batch_invariant_mm.c -L<lib> -lggml-cpu -lggml-base -o bench
//   ./bench [k [rounds]]
#include "ggml.h"
#include "ggml-cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

#define ROWS 16
#define NTOK 16
#define NNS 6
static const int ns[NNS] = { 1, 2, 4, 8, 12, 16 };

// one timed run of variant v (0: vec_dot, 1: multi, 2: multi_rows) at n tokens per call; ns per (row, token)
static double run(const struct ggml_type_traits_cpu * tc, int v, int n, int64_t k, const char * w, size_t wrow,
                  const char * a, size_t arow, float * out, int reps) {
    const double t0 = now();
    for (int r = 0; r < reps; ++r) {
        if (v == 0) {
            for (int i = 0; i < ROWS; ++i)
                for (int t = 0; t < NTOK; ++t)
                    tc->vec_dot((int) k, &out[i + t * ROWS], 0, w + i * wrow, 0, a + t * arow, 0, 1);
        } else if (v == 1) {
            for (int i = 0; i < ROWS; ++i)
                for (int t = 0; t + n <= NTOK; t += n)
                    tc->vec_dot_multi((int) k, &out[i + t * ROWS], ROWS, w + i * wrow, a + t * arow, arow, n);
        } else {
            for (int t = 0; t + n <= NTOK; t += n)
                tc->vec_dot_multi_rows((int) k, &out[t * ROWS], ROWS, w, wrow, ROWS, a + t * arow, arow, n);
        }
    }
    const int ntok = v == 0 ? NTOK : NTOK / n * n;  // tokens covered by the calls
    return (now() - t0) / ((double) reps * ROWS * ntok) * 1e9;
}

int main(int argc, char ** argv) {
    const int64_t k = argc > 1 ? atoll(argv[1]) : 1536;
    const int rounds = argc > 2 ? atoi(argv[2]) : 30;
    ggml_cpu_init();
    const enum ggml_type types[] = { GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K };
    printf("k=%lld, ns per (row, token); CPU time of one thread, minimum of %d interleaved rounds\n", (long long) k, rounds);
    printf("type   vec_dot | multi (1 row)  n=1    n=2    n=4    n=8   n=12   n=16 | multi_rows (16 rows) n=2    n=4    n=8   n=12   n=16\n");
    for (size_t it = 0; it < sizeof(types) / sizeof(types[0]); ++it) {
        const enum ggml_type type = types[it];
        const struct ggml_type_traits_cpu * tc = ggml_get_type_traits_cpu(type);
        const struct ggml_type_traits_cpu * tv = ggml_get_type_traits_cpu(tc->vec_dot_type);
        const size_t wrow = ggml_row_size(type, k), arow = ggml_row_size(tc->vec_dot_type, k);
        float * f = malloc(sizeof(float) * k * (ROWS > NTOK ? ROWS : NTOK));
        for (int64_t i = 0; i < k * ROWS; ++i) f[i] = (float) rand() / RAND_MAX - 0.5f;
        char * w = malloc(wrow * ROWS);
        char * a = malloc(arow * NTOK);
        ggml_quantize_chunk(type, f, w, 0, ROWS, k, NULL);
        for (int64_t i = 0; i < k * NTOK; ++i) f[i] = (float) rand() / RAND_MAX - 0.5f;
        for (int t = 0; t < NTOK; ++t) tv->from_float(f + t * k, a + t * arow, k);
        float out[ROWS * NTOK];
        const int reps = (int) (20 * 1536 / k) + 1;
        double best[3][NNS];
        for (int v = 0; v < 3; ++v) for (int in = 0; in < NNS; ++in) best[v][in] = 1e30;
        for (int rd = 0; rd < rounds; ++rd) {
            for (int in = 0; in < NNS; ++in) {
                for (int v = 0; v < 3; ++v) {
                    if ((v == 0 && in > 0) || (v == 1 && tc->vec_dot_multi == NULL) ||
                        (v == 2 && (tc->vec_dot_multi_rows == NULL || ns[in] == 1))) {
                        continue;
                    }
                    const double x = run(tc, v, ns[in], k, w, wrow, a, arow, out, reps);
                    if (x < best[v][in]) best[v][in] = x;
                }
            }
        }
        printf("%-5s %8.1f |              ", ggml_type_name(type), best[0][0]);
        for (int in = 0; in < NNS; ++in) {
            if (best[1][in] < 1e30) printf("%7.1f", best[1][in]); else printf("%7s", "-");
        }
        printf(" |                 ");
        for (int in = 1; in < NNS; ++in) {
            if (best[2][in] < 1e30) printf("%7.1f", best[2][in]); else printf("%7s", "-");
        }
        printf("\n");
        free(f); free(w); free(a);
    }
    return 0;
}
