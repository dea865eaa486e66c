// Micro-benchmark of ggml-cpu's quantized dot products, one thread, data in cache:
// nanoseconds per (weight row, token) for vec_dot one pair at a time (today's exact path)
// and for vec_dot_multi over n tokens (GGML_CPU_BATCH_INVARIANT_MM), at one row length k.
//   cc -O2 -I<ggml>/include bench_batch_invariant_mm.c -L<lib> -lggml-cpu -lggml-base -o bench
//   ./bench [k]
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

int main(int argc, char ** argv) {
    const int64_t k = argc > 1 ? atoll(argv[1]) : 1536;
    const int rows = 16, ntok = 16;
    ggml_cpu_init();
    const enum ggml_type types[] = { GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K };
    printf("k=%lld, ns per (row, token); CPU time of one thread\n", (long long) k);
    printf("type   vec_dot  multi n=1    n=2    n=4    n=8   n=16\n");
    for (size_t it = 0; it < sizeof(types) / sizeof(types[0]); ++it) {
        const enum ggml_type type = types[it];
        const struct ggml_type_traits_cpu * tc = ggml_get_type_traits_cpu(type);
        const struct ggml_type_traits_cpu * tv = ggml_get_type_traits_cpu(tc->vec_dot_type);
        const size_t wrow = ggml_row_size(type, k), arow = ggml_row_size(tc->vec_dot_type, k);
        float * f = malloc(sizeof(float) * k * (rows > ntok ? rows : ntok));
        for (int64_t i = 0; i < k * rows; ++i) f[i] = (float) rand() / RAND_MAX - 0.5f;
        char * w = malloc(wrow * rows);
        char * a = malloc(arow * ntok);
        ggml_quantize_chunk(type, f, w, 0, rows, k, NULL);
        for (int t = 0; t < ntok; ++t) tv->from_float(f + t * k, a + t * arow, k);
        float out[16 * 16];
        const int reps = 200;
        double t0 = now();
        for (int r = 0; r < reps; ++r)
            for (int i = 0; i < rows; ++i)
                for (int t = 0; t < ntok; ++t)
                    tc->vec_dot((int) k, &out[i * ntok + t], 0, w + i * wrow, 0, a + t * arow, 0, 1);
        const double base = (now() - t0) / (reps * rows * ntok) * 1e9;
        printf("%-5s %8.1f ", ggml_type_name(type), base);
        const int ns[] = { 1, 2, 4, 8, 16 };
        for (int in = 0; in < 5; ++in) {
            const int n = ns[in];
            if (tc->vec_dot_multi == NULL) { printf("%7s", "-"); continue; }
            t0 = now();
            for (int r = 0; r < reps; ++r)
                for (int i = 0; i < rows; ++i)
                    for (int t = 0; t + n <= ntok; t += n)
                        tc->vec_dot_multi((int) k, &out[i * ntok + t], 1, w + i * wrow, a + t * arow, arow, n);
            printf("%7.1f", (now() - t0) / (reps * rows * ntok) * 1e9);
        }
        printf("\n");
        free(f); free(w); free(a);
    }
    return 0;
}
