// Bit-exactness test of ggml-cpu's batch-invariant matmul on repacked weights (CPU_BIMM,
// patches/llama-cpp-batch-invariant.patch: ggml/src/ggml-cpu/bimm.c and bimm-buffer.cpp) and of its
// F16 dot products for the attention's caches (bimm-f16.c).
//
// 1. Kernel level, against the bimm.c and bimm-f16.c linked into this program (tests/test_kernels.py
//    builds them once per instruction-set family: AVX-512 with and without VNNI, AVX2, scalar): for every
//    weight type and three weight distributions, ggml_bimm_mul over n tokens, n in 1..17, 31..33 and
//    64, must equal ggml_bimm_reference (the canonical order in scalar C, on ggml's original layout)
//    bit for bit for every (row, token), with contiguous and strided activations and outputs, and
//    write nothing outside its outputs; every repacked row must unpack to its original bytes; the
//    vectorized Q8_K quantizer must equal ggml's quantize_row_q8_K_ref. A build without kernels
//    must say so (ggml_bimm_supports false) and still unpack. ggml_bimm_f16_dot over any number of
//    rows and columns (1..17), lengths 1..17, 31..33, 64, 100, 128, 640, strided rows, must equal
//    ggml_bimm_f16_dot_ref for every (row, column) and write nothing else.
// 2. Graph level (with --graph, against the installed ggml-cpu): ggml_mul_mat(W, X) with W loaded
//    into the CPU_BIMM buffer type (GGML_CPU_BATCH_INVARIANT=1) over n tokens, 2 threads (64 rows, and 592
//    rows: 37 row groups split unevenly between the threads), must equal column by column the same product
//    computed one token at a time and the reference; an
//    embedding lookup (ggml_get_rows) in CPU_BIMM must equal ggml's dequantization of the original
//    rows; weight types CPU_BIMM does not take (Q5_K) must stay batch-invariant through vec_dot.
//    An F16 tensor flagged GGML_TENSOR_FLAG_BATCH_INVARIANT (as llama.cpp's K/V caches of a
//    batch-invariant context), read through a strided view with grouped-query broadcasting, must
//    give the same column alone or in a batch, and ggml_bimm_f16_dot_ref's bits. The transposed V
//    cache's writes (ggml_set_rows of one-element rows, converted inline) must be ggml's F16
//    rounding of each source element and touch nothing else; soft_max must take each row's maximum
//    wherever it sits (a computed maximum far below the true one would overflow the exponentials).
//
// Prints one line per check group, then "kernels: <isa>" and OK or FAILED; exit status 0 when
// everything matches, 1 otherwise.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-cpu-bimm.h"

#include <math.h>
#include <stdint.h>
#include <pthread.h>
#if defined(__GLIBC__)
#    include <malloc.h>
#endif
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

static const enum ggml_type kTypes[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_1 };
#define N_TYPES ((int) (sizeof(kTypes) / sizeof(kTypes[0])))
static const int kN[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 32, 33, 64 };
#define N_SIZES ((int) (sizeof(kN) / sizeof(kN[0])))

// ---- kernel level ---------------------------------------------------------------------------

static void check_kernels(enum ggml_type type, int64_t k, int64_t rows) {
    const size_t rb = ggml_row_size(type, k);
    float * wf = malloc(sizeof(float) * k * rows);
    char * wq = malloc(rb * rows);
    char * wr = malloc(rb * rows);
    char * back = malloc(rb);
    long kernel_bad = 0, unpack_bad = 0, outside = 0, checked = 0;
    const bool kernels = ggml_bimm_supports(type, k, rows);
    for (int mode = 0; mode < 3; ++mode) {
        fill(wf, k * rows, mode);
        ggml_quantize_chunk(type, wf, wq, 0, rows, k, NULL);
        ggml_bimm_repack(type, wr, wq, rows, k);
        for (int64_t r = 0; r < rows; ++r) {
            ggml_bimm_unpack_row(type, wr, k, r, back);
            unpack_bad += memcmp(back, wq + r * rb, rb) != 0;
        }
        if (!kernels) {
            continue;
        }
        const size_t arow = ggml_bimm_act_row_size(type, k);
        for (int si = 0; si < N_SIZES; ++si) {
            const int n = kN[si];
            for (int strided = 0; strided < 2; ++strided) {
                const size_t astride = arow + (strided ? 192 : 0);
                const size_t dstride = (size_t) rows + (strided ? 7 : 0);
                float * x = malloc(sizeof(float) * k * n);
                fill(x, k * n, (mode + si) % 3);
                char * act = aligned_alloc(64, GGML_PAD(astride * n + 64, 64));
                for (int t = 0; t < n; ++t) {
                    ggml_bimm_prepare(type, x + t * k, act + t * astride, k);
                }
                float * dst = malloc(sizeof(float) * (dstride * n + 16));
                for (size_t i = 0; i < dstride * n + 16; ++i) {
                    dst[i] = -7777.0f;
                }
                ggml_bimm_mul(type, k, wr, rows / GGML_BIMM_ROWS, act, astride, n, dst, dstride);
                for (int t = 0; t < n; ++t) {
                    for (int64_t r = 0; r < rows; ++r) {
                        const float ref = ggml_bimm_reference(type, k, wq + r * rb, act + t * astride);
                        kernel_bad += memcmp(&ref, &dst[t * dstride + r], sizeof(float)) != 0;
                        ++checked;
                    }
                    for (size_t r = rows; r < dstride; ++r) {
                        outside += dst[t * dstride + r] != -7777.0f;
                    }
                }
                for (size_t i = dstride * n; i < dstride * n + 16; ++i) {
                    outside += dst[i] != -7777.0f;
                }
                free(x);
                free(act);
                free(dst);
            }
        }
    }
    printf("%-5s k=%-5lld rows=%-3lld kernels: %-3s kernel mismatches: %ld of %ld, writes outside: %ld, unpack mismatches: %ld\n",
           ggml_type_name(type), (long long) k, (long long) rows, kernels ? "yes" : "no", kernel_bad, checked, outside, unpack_bad);
    failures += kernel_bad + outside + unpack_bad;
    free(wf);
    free(wq);
    free(wr);
    free(back);
}

static void check_quantizer(void) {
    const int64_t k = 1536;
    const enum ggml_type t = GGML_TYPE_Q4_K;
    float * x = malloc(sizeof(float) * k);
    const size_t bytes = ggml_bimm_act_row_size(t, k);
    char * a = calloc(1, bytes), * b = calloc(1, bytes);
    long bad = 0;
    for (int trial = 0; trial < 1000; ++trial) {
        fill(x, k, trial % 3);
        if (trial % 3 == 0) {  // a magnitude tie of opposite signs
            x[(trial * 37) % k] = -x[(trial * 101) % k];
        }
        if (trial % 11 == 0) {  // a block of zeros
            memset(x + 256, 0, 256 * sizeof(float));
        }
        if (trial % 13 == 0) {  // values on rounding ties
            for (int64_t i = 0; i < k; ++i) x[i] = (float) (int) (x[i] * 20.0f) / 8.0f;
        }
        memset(a, 0, bytes);
        memset(b, 0, bytes);
        ggml_bimm_prepare(t, x, a, k);
        ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float(x, b, k);
        bad += memcmp(a, b, ggml_row_size(GGML_TYPE_Q8_K, k)) != 0;
    }
    printf("q8_K quantizer mismatches: %ld of 1000\n", bad);
    failures += bad;
    free(x);
    free(a);
    free(b);
}

// ggml_vec_dot_f16_cols (the F16 rows of attention, several columns at a time) against ggml's own
// vec_dot_f16, bit for bit, for lengths with and without leftovers
void ggml_vec_dot_f16_cols(int n, float * s, size_t bs, const ggml_fp16_t * x, const float * yf, size_t byf, int nc);

static void check_f16_cols(void) {
    const int lengths[] = { 1, 15, 16, 63, 64, 100, 128, 130, 600, 1000 };
    const int nmax = 1000;
    ggml_fp16_t * x = malloc(sizeof(ggml_fp16_t) * nmax);
    ggml_fp16_t * y = malloc(sizeof(ggml_fp16_t) * 4 * nmax);
    float * yf = malloc(sizeof(float) * 4 * nmax);
    long bad = 0, checked = 0;
    const ggml_vec_dot_t vec_dot = ggml_get_type_traits_cpu(GGML_TYPE_F16)->vec_dot;
    for (int li = 0; li < (int) (sizeof(lengths) / sizeof(lengths[0])); ++li) {
        const int n = lengths[li];
        for (int trial = 0; trial < 20; ++trial) {
            for (int i = 0; i < n; ++i) x[i] = ggml_fp32_to_fp16(frand() * 4.0f);
            for (int i = 0; i < 4 * n; ++i) {
                y[i] = ggml_fp32_to_fp16(frand() * ((trial % 3) ? 1.0f : 30.0f));
                yf[i] = ggml_fp16_to_fp32(y[i]);
            }
            for (int nc = 1; nc <= 4; ++nc) {  // the patch's most columns per call
                float out[4];
                ggml_vec_dot_f16_cols(n, out, 1, x, yf, n, nc);
                for (int c = 0; c < nc; ++c) {
                    float ref;
                    vec_dot(n, &ref, 0, x, 0, y + c * n, 0, 1);
                    bad += memcmp(&ref, &out[c], sizeof(float)) != 0;
                    ++checked;
                }
            }
        }
    }
    printf("f16 columns kernel mismatches against vec_dot_f16: %ld of %ld\n", bad, checked);
    failures += bad;
    free(x);
    free(y);
    free(yf);
}

// ggml_bimm_f16_dot (this program's build of bimm-f16.c) against its scalar reference: every block shape
// and remainder, rows x bx apart (bx > n), each output alone in a buffer whose other cells must keep a
// sentinel
static void check_f16_dot(void) {
    const int lengths[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 32, 33, 64, 100, 128, 640 };
    const int counts[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17 };
    const int ncount = (int) (sizeof(counts) / sizeof(counts[0]));
    const int nmax = 640, rmax = 17, cmax = 17, pad = 5;
    const size_t bx = nmax + 3;
    ggml_fp16_t * x = malloc(sizeof(ggml_fp16_t) * bx * rmax);
    ggml_fp16_t * ys = malloc(sizeof(ggml_fp16_t) * nmax * cmax);
    float * out = malloc(sizeof(float) * (rmax + 2 * pad) * cmax);
    long bad = 0, outside = 0, checked = 0;
    for (int li = 0; li < (int) (sizeof(lengths) / sizeof(lengths[0])); ++li) {
        const int n = lengths[li];
        for (int mode = 0; mode < 3; ++mode) {
            float * tmp = malloc(sizeof(float) * (bx * rmax + nmax * cmax));
            fill(tmp, bx * rmax + nmax * cmax, mode);
            for (size_t i = 0; i < bx * rmax; ++i) x[i] = ggml_fp32_to_fp16(tmp[i]);
            for (int i = 0; i < nmax * cmax; ++i) ys[i] = ggml_fp32_to_fp16(tmp[bx * rmax + i] * (mode ? 1.0f : 20.0f));
            free(tmp);
            for (int ri = 0; ri < ncount; ++ri) {
                for (int ci = 0; ci < ncount; ++ci) {
                    const int nr = counts[ri], nc = counts[ci];
                    const ggml_fp16_t * y[17];
                    float * dst[17];
                    for (int c = 0; c < nc; ++c) {
                        y[c] = ys + (size_t) ((c * 7) % cmax) * nmax;  // columns in any order
                        dst[c] = out + c * (rmax + 2 * pad) + pad;
                    }
                    for (int i = 0; i < (rmax + 2 * pad) * cmax; ++i) out[i] = -12345.0f;
                    ggml_bimm_f16_dot(n, nr, nc, x, bx, y, dst);
                    for (int c = 0; c < cmax; ++c) {
                        for (int i = 0; i < rmax + 2 * pad; ++i) {
                            const int r = i - pad;
                            const float v = out[c * (rmax + 2 * pad) + i];
                            if (c < nc && r >= 0 && r < nr) {
                                const float ref = ggml_bimm_f16_dot_ref(n, x + r * bx, y[c]);
                                bad += memcmp(&ref, &v, sizeof(float)) != 0;
                                ++checked;
                            } else {
                                outside += v != -12345.0f;
                            }
                        }
                    }
                }
            }
        }
    }
    printf("f16 dot kernel mismatches against the canonical order: %ld of %ld, writes outside: %ld\n", bad, checked,
           outside);
    failures += bad + outside;
    free(x);
    free(ys);
    free(out);
}

// ---- the per-thread column buffer of ggml_bimm_f16_dot is freed when its thread exits ----------------------

#define LEAK_THREADS 8
#define LEAK_N       (1 << 17)  // 16 columns of 128k floats: 8 MiB per thread's buffer

static void * leak_worker(void * arg) {
    const ggml_fp16_t * v = arg;
    const ggml_fp16_t * y[16];
    float out[16], * dst[16];
    for (int c = 0; c < 16; ++c) {
        y[c]   = v;
        dst[c] = out + c;
    }
    ggml_bimm_f16_dot(LEAK_N, 1, 16, v, LEAK_N, y, dst);
    return NULL;
}

static void check_f16_buffer_freed(void) {
#if defined(__GLIBC__)
    ggml_fp16_t * v = calloc(LEAK_N, sizeof(ggml_fp16_t));
    leak_worker(v);  // this thread's buffer, and glibc's arenas, before measuring
    const struct mallinfo2 before = mallinfo2();
    for (int round = 0; round < 4; ++round) {  // thread pools made and ended, as ggml's are without OpenMP
        pthread_t t[LEAK_THREADS];
        for (int i = 0; i < LEAK_THREADS; ++i) {
            pthread_create(&t[i], NULL, leak_worker, v);
        }
        for (int i = 0; i < LEAK_THREADS; ++i) {
            pthread_join(t[i], NULL);
        }
    }
    const struct mallinfo2 after = mallinfo2();
    const long grown = (long) ((after.uordblks + after.hblkhd) - (before.uordblks + before.hblkhd));
    const long limit = 4L << 20;  // 32 threads' buffers would be 256 MiB
    printf("f16 column buffers of ended threads still allocated: %ld bytes (limit %ld)\n", grown, limit);
    failures += grown > limit;
    free(v);
#else
    printf("f16 column buffers of ended threads: not measured (needs glibc's mallinfo2)\n");
#endif
}

// ---- graph level (the installed build) ------------------------------------------------------

struct loaded {
    struct ggml_context * ctx;
    ggml_backend_buffer_t buf;
    struct ggml_tensor * w;
};

// a weight matrix in the CPU_BIMM buffer type (or the plain CPU one), set through the buffer's set_tensor
static struct loaded load_weight(enum ggml_type type, int64_t k, int64_t m, const void * data, bool bimm) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 2, NULL, true };
    struct loaded L;
    L.ctx = ggml_init(ip);
    L.w = ggml_new_tensor_2d(L.ctx, type, k, m);
    L.buf = ggml_backend_alloc_ctx_tensors_from_buft(L.ctx, bimm ? ggml_backend_cpu_bimm_buffer_type() : ggml_backend_cpu_buffer_type());
    ggml_backend_tensor_set(L.w, data, 0, ggml_nbytes(L.w));
    return L;
}

// out's graph on nthreads threads; with poison, out is filled with NaNs first (an element no thread writes shows)
static void run_graph(struct ggml_context * ctx, struct ggml_tensor * out, int nthreads, bool poison) {
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, nthreads);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
    ggml_gallocr_alloc_graph(ga, gf);
    if (poison) {
        memset(out->data, 0xff, ggml_nbytes(out));
    }
    ggml_backend_graph_compute(be, gf);
    ggml_gallocr_free(ga);
    ggml_backend_free(be);
}

static void compute(struct ggml_context * ctx, struct ggml_tensor * out, int nthreads) {
    run_graph(ctx, out, nthreads, false);
}

static void compute_poisoned(struct ggml_context * ctx, struct ggml_tensor * out, int nthreads) {
    run_graph(ctx, out, nthreads, true);
}

// W (k x m): random values (seeded) quantized to type; the caller frees it
static char * random_weight(enum ggml_type type, int64_t k, int64_t m, int seed) {
    float * wf = malloc(sizeof(float) * k * m);
    fill(wf, k * m, seed);
    char * wq = malloc(ggml_row_size(type, k) * m);
    ggml_quantize_chunk(type, wf, wq, 0, m, k, NULL);
    free(wf);
    return wq;
}

// W (k x m, in CPU_BIMM or not) times n tokens, on nth threads: columns against one token at a time and the reference
static void check_graph(enum ggml_type type, int64_t k, int64_t m, int n, bool bimm, int nth) {
    const size_t rb = ggml_row_size(type, k);
    char * wq = random_weight(type, k, m, 1);
    struct loaded L = load_weight(type, k, m, wq, bimm);
    float * xs = malloc(sizeof(float) * k * n);
    fill(xs, k * n, 2);
    float * all = malloc(sizeof(float) * m * n);
    float * one = malloc(sizeof(float) * m);
    long col_bad = 0, ref_bad = 0;
    for (int pass = 0; pass <= n; ++pass) {  // pass 0: all n tokens; pass t: token t alone
        const int nt = pass == 0 ? n : 1;
        struct ggml_init_params ip = { 64 * 1024 * 1024, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, nt);
        memcpy(x->data, pass == 0 ? xs : xs + (pass - 1) * k, sizeof(float) * k * nt);
        struct ggml_tensor * y = ggml_mul_mat(ctx, L.w, x);
        compute_poisoned(ctx, y, nth);
        if (pass == 0) {
            memcpy(all, y->data, sizeof(float) * m * n);
        } else {
            memcpy(one, y->data, sizeof(float) * m);
            col_bad += memcmp(one, all + (pass - 1) * m, sizeof(float) * m) != 0;
        }
        ggml_free(ctx);
    }
    if (bimm && ggml_bimm_supports(type, k, m)) {  // the columns are the canonical order
        const size_t arow = ggml_bimm_act_row_size(type, k);
        char * act = aligned_alloc(64, GGML_PAD(arow, 64));
        for (int t = 0; t < n; ++t) {
            ggml_bimm_prepare(type, xs + t * k, act, k);
            for (int64_t r = 0; r < m; ++r) {
                const float ref = ggml_bimm_reference(type, k, wq + r * rb, act);
                ref_bad += memcmp(&ref, all + t * m + r, sizeof(float)) != 0;
            }
        }
        free(act);
    }
    printf("%-5s %s mul_mat n=%-2d column mismatches: %ld, reference mismatches: %ld, rows: %lld, threads: %d\n",
           ggml_type_name(type), bimm ? "CPU_BIMM" : "CPU     ", n, col_bad, ref_bad, (long long) m, nth);
    failures += col_bad + ref_bad;
    ggml_backend_buffer_free(L.buf);
    ggml_free(L.ctx);
    free(wq);
    free(xs);
    free(all);
    free(one);
}

// attention's products with a flagged cache: K (k x m cells x 2 heads, in a buffer of 3 heads' width) read
// through a view, times 6 query heads x n tokens (3 per K head), on nth threads (each takes one contiguous range
// of the 6n columns, every row; with more threads than columns the rows of a column are split too); each token
// alone must give its columns of the batch, and every output must be ggml_bimm_f16_dot_ref of the cell and the
// query rounded to F16
static void check_flagged_f16(int64_t k, int64_t m, int n, int nth) {
    const int hk = 2, hq = 6, width = 3;
    struct ggml_init_params cip = { ggml_tensor_overhead() * 2 + sizeof(ggml_fp16_t) * k * width * m + 64, NULL, false };
    struct ggml_context * cctx = ggml_init(cip);
    struct ggml_tensor * cache = ggml_new_tensor_2d(cctx, GGML_TYPE_F16, k * width, m);
    cache->flags |= GGML_TENSOR_FLAG_BATCH_INVARIANT;
    float * cf = malloc(sizeof(float) * k * width * m);
    fill(cf, k * width * m, 1);
    for (int64_t i = 0; i < k * width * m; ++i) ((ggml_fp16_t *) cache->data)[i] = ggml_fp32_to_fp16(cf[i]);
    free(cf);
    float * qs = malloc(sizeof(float) * k * n * hq);
    fill(qs, k * n * hq, 2);
    float * all = malloc(sizeof(float) * m * n * hq);
    long col_bad = 0, ref_bad = 0;
    for (int pass = 0; pass <= n; ++pass) {  // pass 0: all n tokens; pass t: token t alone
        const int nt = pass == 0 ? n : 1;
        struct ggml_init_params ip = { 64 * 1024 * 1024, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * kv = ggml_view_3d(ctx, cache, k, m, hk, cache->nb[1], k * sizeof(ggml_fp16_t), 0);
        struct ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, nt, hq);
        for (int h = 0; h < hq; ++h) {
            for (int t = 0; t < nt; ++t) {
                const int tok = pass == 0 ? t : pass - 1;
                memcpy((float *) q->data + (h * nt + t) * k, qs + (h * n + tok) * k, sizeof(float) * k);
            }
        }
        struct ggml_tensor * y = ggml_mul_mat(ctx, kv, q);
        compute_poisoned(ctx, y, nth);
        for (int h = 0; h < hq; ++h) {
            for (int t = 0; t < nt; ++t) {
                const float * got = (const float *) y->data + (h * nt + t) * m;
                if (pass == 0) {
                    memcpy(all + (h * n + t) * m, got, sizeof(float) * m);
                } else {
                    col_bad += memcmp(got, all + (h * n + pass - 1) * m, sizeof(float) * m) != 0;
                }
            }
        }
        ggml_free(ctx);
    }
    ggml_fp16_t * qh = malloc(sizeof(ggml_fp16_t) * k);
    for (int h = 0; h < hq; ++h) {
        for (int t = 0; t < n; ++t) {
            for (int64_t i = 0; i < k; ++i) qh[i] = ggml_fp32_to_fp16(qs[(h * n + t) * k + i]);
            for (int64_t j = 0; j < m; ++j) {
                const ggml_fp16_t * cell = (const ggml_fp16_t *) cache->data + j * k * width + (h / (hq / hk)) * k;
                const float ref = ggml_bimm_f16_dot_ref(k, cell, qh);
                ref_bad += memcmp(&ref, all + (h * n + t) * m + j, sizeof(float)) != 0;
            }
        }
    }
    printf("f16   flagged  mul_mat k=%-3d n=%-2d threads=%-2d column mismatches: %ld, reference mismatches: %ld\n",
           (int) k, n, nth, col_bad, ref_bad);
    failures += col_bad + ref_bad;
    free(qh);
    free(qs);
    free(all);
    ggml_free(cctx);
}

// the transposed V cache's writes: ggml_set_rows of one-element rows (a row per (token, channel)) into an F16
// tensor of one-element rows, at the positions llama.cpp's V indices give (channel * cells + cell), which the
// patch converts inline, each thread writing the elements in its own part of the cache (cut at cache lines).
// Every written element must be ggml's F16 rounding of its source, every other element untouched; with 1, 2
// and 3 threads, so that the parts' boundaries fall inside the written cells
static void check_set_rows_transposed(int64_t channels, int64_t cells, int tokens) {
    long bad = 0, checked = 0;
    for (int nth = 1; nth <= 3; ++nth) {
        struct ggml_init_params ip = { 16 * 1024 * 1024, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * cache = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 1, channels * cells);
        struct ggml_tensor * src = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, channels * tokens);
        struct ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, channels * tokens);
        const ggml_fp16_t sentinel = ggml_fp32_to_fp16(-7.0f);
        for (int64_t i = 0; i < channels * cells; ++i) ((ggml_fp16_t *) cache->data)[i] = sentinel;
        fill((float *) src->data, channels * tokens, 1);
        for (int t = 0; t < tokens; ++t) {
            for (int64_t c = 0; c < channels; ++c) {  // token t at cell 3 + 2t: rows t * channels + c
                ((int64_t *) idx->data)[t * channels + c] = c * cells + 3 + 2 * t;
            }
        }
        struct ggml_tensor * y = ggml_set_rows(ctx, cache, src, idx);
        compute(ctx, y, nth);
        for (int64_t c = 0; c < channels; ++c) {
            for (int64_t j = 0; j < cells; ++j) {
                const int written = j >= 3 && j < 3 + 2 * tokens && (j - 3) % 2 == 0;
                const ggml_fp16_t want = written ? ggml_fp32_to_fp16(((float *) src->data)[((j - 3) / 2) * channels + c])
                                                 : sentinel;
                bad += ((ggml_fp16_t *) cache->data)[c * cells + j] != want;
                checked += written;
            }
        }
        ggml_free(ctx);
    }
    printf("f16   set_rows of one-element rows (1-3 threads) mismatches: %ld, elements written: %ld\n", bad, checked);
    failures += bad;
}

// soft_max takes each row's maximum before its exponentials: a row whose maximum (200, whose exponential
// overflows a float) sits at any position, in the vector steps or the tail, must give a finite one-hot row
// (a computed maximum below about 111 overflows; one within about 89 of the true maximum passes, changing
// roundings only: the bitwise logit checks, not this one, see those)
static void check_soft_max_max(void) {
    const int lens[] = { 5, 16, 33, 100, 640 };
    long bad = 0, rows = 0;
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); ++li) {
        const int n = lens[li];
        struct ggml_init_params ip = { 16 * 1024 * 1024, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n);
        fill((float *) x->data, (int64_t) n * n, 0);
        for (int j = 0; j < n; ++j) ((float *) x->data)[j * n + j] = 200.0f;  // row j: the maximum at j
        struct ggml_tensor * y = ggml_soft_max(ctx, x);
        compute_poisoned(ctx, y, 2);
        for (int j = 0; j < n; ++j) {
            const float * row = (const float *) y->data + j * n;
            int ok = row[j] > 0.999f && row[j] <= 1.0f;
            for (int i = 0; i < n; ++i) ok = ok && isfinite(row[i]);
            bad += !ok;
            ++rows;
        }
        ggml_free(ctx);
    }
    printf("f32   soft_max rows with the maximum anywhere: %ld of %ld wrong\n", bad, rows);
    failures += bad;
}

// single-token rows that the patch splits across threads (ops.cpp): swiglu's columns, when there are fewer rows
// than threads, in pieces of multiples of 64 elements, and soft_max's rows of every head and sequence (not of one
// head's tokens only). Outputs are poisoned with NaNs before each compute.
// swiglu: with 2 and 3 threads every element must be bitwise what one thread computes (whole rows); a piece
// boundary inside a vector step would send elements through the scalar path (another exponential). Lengths 1000
// (a tail after the last vector step; an unaligned split would land at 500) and 8960 (Qwen2.5-Coder-1.5B's FFN),
// 1 and 2 rows (2 rows on 2 threads take the row split; the others the column split), both forms of the op.
// soft_max: 640 cells x 3 tokens x 12 heads x 2 sequences with a mask whose 3 rows differ, on 1, 2 and 3 threads,
// every row against a graph of that row alone (a row mapped to the wrong input, mask or output shows)
static void check_split_single_rows(void) {
    long bad = 0, checked = 0;
    const int lens[] = { 1000, 8960 };
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); ++li) {
        for (int rows = 1; rows <= 2; ++rows) {
            for (int split = 0; split <= 1; ++split) {  // ggml_swiglu (one source) and ggml_swiglu_split
                const int n = lens[li];
                float * ref = malloc(sizeof(float) * n * rows);
                const uint64_t seed = rng_state;  // the same inputs for every thread count
                for (int nth = 1; nth <= 3; ++nth) {
                    rng_state = seed;
                    struct ggml_init_params ip = { 16 * 1024 * 1024, NULL, false };
                    struct ggml_context * ctx = ggml_init(ip);
                    struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, split ? n : 2 * n, rows);
                    fill((float *) a->data, ggml_nelements(a), 1);
                    struct ggml_tensor * y;
                    if (split) {
                        struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, rows);
                        fill((float *) b->data, ggml_nelements(b), 0);
                        y = ggml_swiglu_split(ctx, a, b);
                    } else {
                        y = ggml_swiglu(ctx, a);
                    }
                    compute_poisoned(ctx, y, nth);
                    if (nth == 1) {
                        memcpy(ref, y->data, sizeof(float) * n * rows);
                    } else {
                        for (int64_t i = 0; i < (int64_t) n * rows; ++i) {
                            bad += memcmp((const float *) y->data + i, ref + i, sizeof(float)) != 0;
                            ++checked;
                        }
                    }
                    ggml_free(ctx);
                }
                free(ref);
            }
        }
    }
    printf("f32   swiglu of fewer rows than threads (2, 3 threads against 1) mismatches: %ld of %ld\n", bad, checked);
    failures += bad;

    bad = checked = 0;
    enum { CELLS = 640, TOKENS = 3, HEADS = 12, SEQS = 2 };
    const int64_t nrow = (int64_t) TOKENS * HEADS * SEQS;
    float * xs = malloc(sizeof(float) * CELLS * nrow);
    float * ms = malloc(sizeof(float) * CELLS * TOKENS);
    float * ref = malloc(sizeof(float) * CELLS * nrow);
    fill(xs, CELLS * nrow, 1);
    for (int t = 0; t < TOKENS; ++t) {
        for (int i = 0; i < CELLS; ++i) ms[t * CELLS + i] = i < 590 + 5 * t ? 0.0f : -INFINITY;
    }
    for (int64_t r = 0; r < nrow; ++r) {  // each row alone: its input row, its token's mask row
        struct ggml_init_params ip = { 1024 * 1024, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, CELLS, 1);
        struct ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, CELLS, 1);
        memcpy(x->data, xs + r * CELLS, sizeof(float) * CELLS);
        memcpy(mask->data, ms + (r % TOKENS) * CELLS, sizeof(float) * CELLS);
        struct ggml_tensor * y = ggml_soft_max_ext(ctx, x, mask, 0.125f, 0.0f);
        compute_poisoned(ctx, y, 1);
        memcpy(ref + r * CELLS, y->data, sizeof(float) * CELLS);
        ggml_free(ctx);
    }
    for (int nth = 1; nth <= 3; ++nth) {
        struct ggml_init_params ip = { 16 * 1024 * 1024, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, CELLS, TOKENS, HEADS, SEQS);
        struct ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, CELLS, TOKENS);
        memcpy(x->data, xs, sizeof(float) * CELLS * nrow);
        memcpy(mask->data, ms, sizeof(float) * CELLS * TOKENS);
        struct ggml_tensor * y = ggml_soft_max_ext(ctx, x, mask, 0.125f, 0.0f);
        compute_poisoned(ctx, y, nth);
        for (int64_t i = 0; i < (int64_t) CELLS * nrow; ++i) {
            bad += memcmp((const float *) y->data + i, ref + i, sizeof(float)) != 0;
            ++checked;
        }
        ggml_free(ctx);
    }
    free(xs);
    free(ms);
    free(ref);
    printf("f32   soft_max rows of tokens, heads and sequences (1-3 threads against each row alone) mismatches: %ld of %ld\n",
           bad, checked);
    failures += bad;
}

// embedding lookups in CPU_BIMM against ggml's dequantization of the original rows
static void check_get_rows(enum ggml_type type, int64_t k, int64_t m) {
    const size_t rb = ggml_row_size(type, k);
    char * wq = random_weight(type, k, m, 0);
    struct loaded L = load_weight(type, k, m, wq, true);
    struct ggml_init_params ip = { 16 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    const int nidx = 7;
    struct ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, nidx);
    for (int i = 0; i < nidx; ++i) ((int32_t *) idx->data)[i] = (int32_t) ((i * 37 + 5) % m);
    struct ggml_tensor * y = ggml_get_rows(ctx, L.w, idx);
    compute_poisoned(ctx, y, 2);
    float * ref = malloc(sizeof(float) * k);
    long bad = 0;
    for (int i = 0; i < nidx; ++i) {
        ggml_get_type_traits(type)->to_float(wq + ((int32_t *) idx->data)[i] * rb, ref, k);
        bad += memcmp(ref, (float *) y->data + i * k, sizeof(float) * k) != 0;
    }
    printf("%-5s CPU_BIMM get_rows mismatches: %ld of %d\n", ggml_type_name(type), bad, nidx);
    failures += bad;
    ggml_free(ctx);
    ggml_backend_buffer_free(L.buf);
    ggml_free(L.ctx);
    free(wq);
    free(ref);
}

int main(int argc, char ** argv) {
    ggml_cpu_init();
    const bool graph = argc > 1 && strcmp(argv[1], "--graph") == 0;
    for (int i = 0; i < N_TYPES; ++i) {
        check_kernels(kTypes[i], 256, 16);
        check_kernels(kTypes[i], 1536, 48);
    }
    check_quantizer();
    check_f16_dot();
    check_f16_buffer_freed();
    if (graph) {
        setenv("GGML_CPU_BATCH_INVARIANT", "1", 1);
        setenv("GGML_CPU_TILED_MM", "0", 1);
        for (int i = 0; i < N_TYPES; ++i) {
            for (int n = 2; n <= 33; n += 15) {
                check_graph(kTypes[i], 512, 64, n, true, 2);
            }
            check_get_rows(kTypes[i], 512, 64);
        }
        // 37 row groups: the 2 threads' contiguous ranges of 18 and 19 groups (an uneven split)
        check_graph(GGML_TYPE_Q8_0, 256, 592, 3, true, 2);
        // 17 tokens x 1536 columns on 3 threads (activation rows prepared in shares of 6, 6 and 5, row groups
        // split 1, 1 and 2)
        check_graph(GGML_TYPE_Q4_K, 1536, 64, 17, true, 3);
        check_graph(GGML_TYPE_Q5_K, 512, 64, 9, false, 2);  // a type CPU_BIMM does not take: vec_dot
        check_graph(GGML_TYPE_F16, 600, 64, 9, false, 2);   // F16 rows, as the attention's caches
        check_f16_cols();
        check_flagged_f16(128, 67, 9, 2);  // a head dimension, cells not a multiple of the 4-row blocks
        check_flagged_f16(100, 40, 5, 2);  // a length with a partial last step
        check_flagged_f16(100, 40, 5, 3);  // 30 columns in 3 ranges, the second crossing from one K/V head to the other
        check_flagged_f16(128, 67, 9, 4);  // 54 columns in ranges of 14 (the last 12), the second crossing K/V heads
        check_flagged_f16(64, 33, 1, 4);   // 6 columns on 4 threads: ranges of 2, the last thread idle
        check_flagged_f16(64, 33, 1, 13);  // more threads than columns: a column's rows split between 2 threads
        check_set_rows_transposed(256, 77, 8);  // the 1.5B's 2 K/V heads x 128 channels, 8 tokens
        check_set_rows_transposed(5, 9, 3);     // a small cache
        check_soft_max_max();
        check_split_single_rows();
    }
    const char * isa = ggml_bimm_isa();
    printf("kernels: %s\n", isa ? isa : "none");
    printf(failures ? "FAILED\n" : "OK\n");
    return failures ? 1 : 0;
}
