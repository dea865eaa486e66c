// Bit-exactness test of ggml-cpu's batch-invariant multi-token dot products
// (patches/llama-cpp-batch-invariant.patch, build option GGML_CPU_BATCH_INVARIANT_MM).
//
// 1. Kernel level: for every weight type with a vec_dot_multi kernel, and n tokens in
//    1..16, 17, 31, 32, 33, 64 (and other odd sizes), vec_dot_multi(row, n tokens) must
//    equal vec_dot(row, token) bit for bit for every token, with contiguous and strided
//    token rows and output strides; and, for weight types with a vec_dot_multi_rows kernel,
//    nr weight rows (1, 2, 3, 5, 16, 17, 33: row groups and odd remainders) x n tokens against
//    vec_dot bit for bit, with contiguous and strided weight rows, token rows and outputs, and
//    no write outside the outputs (row lengths 256, 1536 and 2304: the last also takes the
//    multi-row tiles at 8 tokens).
// 2. Graph level: ggml_mul_mat(W, X) over n tokens (2 threads) must equal, column by column,
//    the same product computed one token at a time, for every tested weight type
//    (also types without a multi kernel, which keep the per-pair vec_dot path).
//
// Runs with GGML_CPU_TILED_MM=0, as the exact numerics mode does.
// Built against the ggml headers and shared libraries of the build under test:
//   cc -O2 -I<ggml>/include test_batch_invariant_mm.c -L<lib> -lggml-cpu -lggml-base -lggml -lm
// Exit status 0 when everything matches, 1 otherwise; prints one line per check group (and one per
// multi-row kernel), then the number of multi-row kernels, then OK or FAILED.

#include "ggml.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float frand(void) {  // uniform in [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void fill(float * x, int64_t n, int mode) {
    for (int64_t i = 0; i < n; ++i) {
        float v = frand();
        if (mode == 1) {
            v = v * v * v * 8.0f;               // heavy tails
        } else if (mode == 2) {
            v = (i % 97 == 0) ? 30.0f * v : v;  // outliers
        }
        x[i] = v;
    }
}

static int failures = 0;

static const int kN[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 32, 33, 64 };
#define N_SIZES ((int) (sizeof(kN) / sizeof(kN[0])))

// the tokens' activations quantized to the kernel's partner type, strided (aq, rows of astride bytes)
// and contiguous (aqc, rows of arow bytes)
static void quantize_tokens(const struct ggml_type_traits_cpu * tv, const float * af, int64_t k, int ntok,
                            char * aq, size_t astride, char * aqc, size_t arow) {
    for (int t = 0; t < ntok; ++t) {
        tv->from_float(af + t * k, aq + t * astride, k);
        memcpy(aqc + t * arow, aq + t * astride, arow);
    }
}

// the reference: ref[r*ntok + t] = vec_dot(weight row r, token t), one pair at a time
static void reference_dots(const struct ggml_type_traits_cpu * tc, int64_t k, const char * w, size_t wrow, int nrows,
                           const char * a, size_t arow, int ntok, float * ref) {
    for (int r = 0; r < nrows; ++r) {
        for (int t = 0; t < ntok; ++t) {
            tc->vec_dot((int) k, &ref[r * ntok + t], 0, w + r * wrow, 0, a + t * arow, 0, 1);
        }
    }
}

// kernel-level check: returns number of mismatching outputs
static int check_kernel(enum ggml_type type, int64_t k, int nrows, int mode) {
    const struct ggml_type_traits_cpu * tc = ggml_get_type_traits_cpu(type);
    if (tc->vec_dot_multi == NULL) {
        return 0;
    }
    const enum ggml_type vt = tc->vec_dot_type;
    const struct ggml_type_traits_cpu * tv = ggml_get_type_traits_cpu(vt);
    const size_t wrow = ggml_row_size(type, k);
    const size_t arow = ggml_row_size(vt, k);
    const int ntok = 64;
    const size_t astride = arow + 64;  // strided token rows (as for a non-contiguous src1)

    float * wf = malloc(sizeof(float) * k * nrows);
    float * af = malloc(sizeof(float) * k * ntok);
    char * wq = malloc(wrow * nrows);
    char * aq = malloc(astride * ntok);
    char * aqc = malloc(arow * ntok);
    float * ref = malloc(sizeof(float) * nrows * ntok);
    float * out = malloc(sizeof(float) * 3 * ntok);
    fill(wf, k * nrows, mode);
    fill(af, k * ntok, mode);
    ggml_quantize_chunk(type, wf, wq, 0, nrows, k, NULL);
    quantize_tokens(tv, af, k, ntok, aq, astride, aqc, arow);
    reference_dots(tc, k, wq, wrow, nrows, aq, astride, ntok, ref);
    int bad = 0;
    for (int r = 0; r < nrows; ++r) {
        for (int si = 0; si < N_SIZES; ++si) {
            const int n = kN[si];
            for (int t0 = 0; t0 + n <= ntok; t0 += (n < 8 ? 7 : n)) {
                // contiguous tokens, contiguous outputs
                memset(out, 0xFF, sizeof(float) * 3 * ntok);
                tc->vec_dot_multi((int) k, out, 1, wq + r * wrow, aqc + t0 * arow, arow, n);
                for (int t = 0; t < n; ++t) {
                    if (memcmp(&out[t], &ref[r * ntok + t0 + t], sizeof(float)) != 0) {
                        if (bad < 5) {
                            fprintf(stderr, "  mismatch %s k=%lld row=%d n=%d token=%d: %.9g vs vec_dot %.9g\n",
                                    ggml_type_name(type), (long long) k, r, n, t0 + t, out[t], ref[r * ntok + t0 + t]);
                        }
                        ++bad;
                    }
                }
                // strided tokens, strided outputs (bs = 3)
                memset(out, 0xFF, sizeof(float) * 3 * ntok);
                tc->vec_dot_multi((int) k, out, 3, wq + r * wrow, aq + t0 * astride, astride, n);
                for (int t = 0; t < n; ++t) {
                    if (memcmp(&out[3 * t], &ref[r * ntok + t0 + t], sizeof(float)) != 0) {
                        ++bad;
                    }
                }
            }
        }
    }
    free(wf); free(af); free(wq); free(aq); free(aqc); free(ref); free(out);
    return bad;
}

// kernel-level check of vec_dot_multi_rows (nr weight rows x n tokens): returns number of mismatching outputs,
// counting writes outside the outputs as mismatches too
static const int kR[] = { 1, 2, 3, 5, 16, 17, 33 };
#define N_ROWCOUNTS ((int) (sizeof(kR) / sizeof(kR[0])))

static int check_kernel_rows(enum ggml_type type, int64_t k, int mode) {
    const struct ggml_type_traits_cpu * tc = ggml_get_type_traits_cpu(type);
    if (tc->vec_dot_multi_rows == NULL) {
        return 0;
    }
    const enum ggml_type vt = tc->vec_dot_type;
    const struct ggml_type_traits_cpu * tv = ggml_get_type_traits_cpu(vt);
    const int maxr = 33, ntok = 64;
    const size_t wrow = ggml_row_size(type, k);
    const size_t arow = ggml_row_size(vt, k);
    const size_t wstride = wrow + 48;  // strided weight rows
    const size_t astride = arow + 64;  // strided token rows

    float * wf = malloc(sizeof(float) * k * maxr);
    float * af = malloc(sizeof(float) * k * ntok);
    char * wq = malloc(wstride * maxr);
    char * wqc = malloc(wrow * maxr);
    char * aq = malloc(astride * ntok);
    char * aqc = malloc(arow * ntok);
    float * ref = malloc(sizeof(float) * maxr * ntok);
    const size_t nout = (size_t) (maxr + 5) * (ntok + 1);
    float * out = malloc(sizeof(float) * nout);
    fill(wf, k * maxr, mode);
    fill(af, k * ntok, mode);
    ggml_quantize_chunk(type, wf, wqc, 0, maxr, k, NULL);
    for (int r = 0; r < maxr; ++r) {
        memcpy(wq + r * wstride, wqc + r * wrow, wrow);
    }
    quantize_tokens(tv, af, k, ntok, aq, astride, aqc, arow);
    reference_dots(tc, k, wqc, wrow, maxr, aqc, arow, ntok, ref);
    int bad = 0;
    for (int ri = 0; ri < N_ROWCOUNTS; ++ri) {
        const int nr = kR[ri];
        for (int r0 = 0; r0 + nr <= maxr; r0 += (nr < 8 ? 11 : maxr)) {
            for (int si = 0; si < N_SIZES; ++si) {
                const int n = kN[si];
                for (int t0 = 0; t0 + n <= ntok; t0 += (n < 8 ? 13 : n)) {
                    for (int strided = 0; strided < 2; ++strided) {
                        // outputs s[r + t*bs]: bs = nr (contiguous) or nr + 5 (strided)
                        const size_t bs = strided ? (size_t) nr + 5 : (size_t) nr;
                        memset(out, 0xFF, sizeof(float) * nout);
                        if (strided) {
                            tc->vec_dot_multi_rows((int) k, out, bs, wq + r0 * wstride, wstride, nr, aq + t0 * astride, astride, n);
                        } else {
                            tc->vec_dot_multi_rows((int) k, out, bs, wqc + r0 * wrow, wrow, nr, aqc + t0 * arow, arow, n);
                        }
                        for (size_t e = 0; e < nout; ++e) {
                            const int r = (int) (e % bs), t = (int) (e / bs);
                            const int inside = r < nr && t < n;
                            uint32_t bits;
                            memcpy(&bits, &out[e], sizeof(bits));
                            if (inside ? memcmp(&out[e], &ref[(r0 + r) * ntok + t0 + t], sizeof(float)) != 0 : bits != 0xFFFFFFFFu) {
                                if (bad < 5) {
                                    fprintf(stderr, "  rows mismatch %s k=%lld rows=%d+%d n=%d strided=%d at (%d, %d): %.9g vs vec_dot %.9g\n",
                                            ggml_type_name(type), (long long) k, r0, nr, n, strided, r, t, out[e],
                                            inside ? ref[(r0 + r) * ntok + t0 + t] : 0.0f);
                                }
                                ++bad;
                            }
                        }
                    }
                }
            }
        }
    }
    free(wf); free(af); free(wq); free(wqc); free(aq); free(aqc); free(ref); free(out);
    return bad;
}

// graph-level check: mul_mat over n tokens vs one token at a time
static int check_graph(enum ggml_type type, int64_t k, int64_t m, int n, int nthreads) {
    const size_t mem = ggml_row_size(type, k) * m + (size_t) (k + m) * n * sizeof(float) * 4 + 512ull * 1024 * 1024;
    struct ggml_init_params ip = { mem, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * w = ggml_new_tensor_2d(ctx, type, k, m);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    float * wf = malloc(sizeof(float) * k * m);
    fill(wf, k * m, 0);
    ggml_quantize_chunk(type, wf, w->data, 0, m, k, NULL);
    fill((float *) x->data, k * n, 0);

    struct ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_graph_compute_with_ctx(ctx, gf, nthreads);

    int bad = 0;
    for (int t = 0; t < n; ++t) {
        struct ggml_tensor * xt = ggml_view_2d(ctx, x, k, 1, x->nb[1], (size_t) t * x->nb[1]);
        struct ggml_tensor * yt = ggml_mul_mat(ctx, w, xt);
        struct ggml_cgraph * g1 = ggml_new_graph(ctx);
        ggml_build_forward_expand(g1, yt);
        ggml_graph_compute_with_ctx(ctx, g1, nthreads);
        if (memcmp(yt->data, (char *) y->data + t * y->nb[1], m * sizeof(float)) != 0) {
            ++bad;
        }
    }
    free(wf);
    ggml_free(ctx);
    return bad;
}

int main(int argc, char ** argv) {
    (void) argc; (void) argv;
    // the tiled K-quant matmul (on by default) is not batch-invariant; exact mode turns it off
    setenv("GGML_CPU_TILED_MM", "0", 1);
    ggml_cpu_init();
    const enum ggml_type types[] = { GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K,
                                     GGML_TYPE_Q4_0, GGML_TYPE_Q5_K, GGML_TYPE_F16 };
    const int ntypes = (int) (sizeof(types) / sizeof(types[0]));
    printf("batch_invariant_mm=%d\n", ggml_cpu_has_batch_invariant_mm());
    int kernels = 0, row_kernels = 0;
    for (int i = 0; i < ntypes; ++i) {
        const enum ggml_type type = types[i];
        const struct ggml_type_traits_cpu * tc = ggml_get_type_traits_cpu(type);
        int bad = 0, rbad = 0;
        if (tc->vec_dot_multi != NULL) {
            ++kernels;
            for (int mode = 0; mode < 3; ++mode) {
                bad += check_kernel(type, 256, 3, mode);
                bad += check_kernel(type, 1536, 2, mode);
            }
        }
        if (tc->vec_dot_multi_rows != NULL) {
            ++row_kernels;
            for (int mode = 0; mode < 3; ++mode) {
                rbad += check_kernel_rows(type, 256, mode);
            }
            rbad += check_kernel_rows(type, 1536, 0);
            rbad += check_kernel_rows(type, 2304, 1);  // rows of more than 2048 weights: 8-token tiles too
        }
        const int gbad = check_graph(type, 512, 96, 13, 2) + check_graph(type, 256, 40, 64, 2) + check_graph(type, 768, 33, 7, 1) +
                         check_graph(type, 1024, 37, 29, 2) + check_graph(type, 2304, 21, 8, 2);
        printf("%-5s multi-token kernel: %-4s kernel mismatches: %d, mul_mat column mismatches: %d\n",
               ggml_type_name(type), tc->vec_dot_multi ? "yes" : "no", bad, gbad);
        if (tc->vec_dot_multi_rows != NULL) {
            printf("%-5s multi-row kernel: yes  kernel mismatches: %d\n", ggml_type_name(type), rbad);
        }
        failures += bad + rbad + gbad;
    }
    printf("multi-row kernels: %d\n", row_kernels);
    printf("%s (%d multi-token kernels)\n", failures == 0 ? "OK" : "FAILED", kernels);
    return failures == 0 ? 0 : 1;
}
