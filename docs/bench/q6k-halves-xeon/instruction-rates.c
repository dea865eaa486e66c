// Issue rate of single AVX-512 instructions on one core: 12 independent chains of one instruction, 10^8
// iterations each; prints G instructions per second. vpdpbusd with a register operand and with a 4-byte
// memory operand broadcast ({1to16}, as the BIMM tiles read activations), vpdpwssd, vpmulld, vpandd.
// Build: gcc -O2 -march=native -mno-amx-tile instruction-rates.c -o /tmp/mb
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int32_t buf[64] __attribute__((aligned(64)));

#define N 100000000L
// 12 chains: instruction INSN with source SRC(i) (i = chain, for a per-chain memory offset) and u, into a<i>
#define CHAINS(INSN, SRC)                                                                                     \
    INSN " " SRC(0) ",%[u],%[a0]\n" INSN " " SRC(4) ",%[u],%[a1]\n" INSN " " SRC(8) ",%[u],%[a2]\n"             \
    INSN " " SRC(12) ",%[u],%[a3]\n" INSN " " SRC(16) ",%[u],%[a4]\n" INSN " " SRC(20) ",%[u],%[a5]\n"          \
    INSN " " SRC(24) ",%[u],%[a6]\n" INSN " " SRC(28) ",%[u],%[a7]\n" INSN " " SRC(32) ",%[u],%[a8]\n"          \
    INSN " " SRC(36) ",%[u],%[a9]\n" INSN " " SRC(40) ",%[u],%[a10]\n" INSN " " SRC(44) ",%[u],%[a11]\n"
#define REG(off)   "%[s]"
#define BCAST(off) #off "(%[p])%{1to16%}"
#define RATE(INSN, SRC)                                                                                        \
    ({                                                                                                         \
        const double t0 = now();                                                                               \
        for (long i = 0; i < N; ++i) {                                                                         \
            __asm__ volatile(CHAINS(INSN, SRC)                                                                 \
                             : [a0] "+v"(a0), [a1] "+v"(a1), [a2] "+v"(a2), [a3] "+v"(a3), [a4] "+v"(a4),      \
                               [a5] "+v"(a5), [a6] "+v"(a6), [a7] "+v"(a7), [a8] "+v"(a8), [a9] "+v"(a9),      \
                               [a10] "+v"(a10), [a11] "+v"(a11)                                               \
                             : [u] "v"(u), [s] "v"(s), [p] "r"(buf));                                          \
        }                                                                                                      \
        12.0 * N / 1e9 / (now() - t0);                                                                         \
    })

int main(void) {
    for (int i = 0; i < 64; i++) buf[i] = i * 0x01010101;
    // named variables, not an array: an array's chains would go through memory on every iteration
    __m512i a0 = _mm512_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
            a9 = a0, a10 = a0, a11 = a0;
    const __m512i u = _mm512_set1_epi32(0x01020304), s = _mm512_set1_epi32(0x01010101);
    const double r1 = RATE("vpdpbusd", REG), r2 = RATE("vpdpbusd", BCAST), r3 = RATE("vpdpwssd", REG);
    const double r4 = RATE("vpmulld", REG), r5 = RATE("vpandd", REG);
    printf("dpbusd reg %.2f G/s, dpbusd bcast-mem %.2f G/s, dpwssd %.2f G/s, pmulld %.2f G/s, pandd %.2f G/s\n",
           r1, r2, r3, r4, r5);
    __m512i x = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    x = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    int32_t o[16];
    _mm512_storeu_si512(o, x);
    return o[0] == 7;  // keeps the chains live
}
