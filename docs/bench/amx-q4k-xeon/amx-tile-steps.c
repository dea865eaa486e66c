#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <immintrin.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <x86intrin.h>
typedef struct __attribute__((aligned(64))) { uint8_t palette_id, start_row; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
#define LD(t,p,s) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t :: "r"(p), "r"((long)(s)) : "memory")
#define ST(t,p,s) __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" :: "r"(p), "r"((long)(s)) : "memory")
#define Z(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define DP(c,a,b) __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
static uint8_t B[8][512] __attribute__((aligned(64)));
static int8_t A[16*4096] __attribute__((aligned(64)));
static int32_t C[8][16*16] __attribute__((aligned(64)));
int main(int argc, char**argv){
  syscall(SYS_arch_prctl, 0x1023, 18);
  int T = argc > 1 ? atoi(argv[1]) : 8;
  cfg_t c; memset(&c,0,sizeof c); c.palette_id=1;
  for (int i=0;i<8;i++){ c.rows[i]=T; c.colsb[i]=64; }
  c.rows[2]=c.rows[3]=8; c.rows[6]=c.rows[7]=T; c.colsb[4]=c.colsb[5]=32;
  _tile_loadconfig(&c);
  const long N = 200000; long astr = 292;
  __m512i acc = _mm512_setzero_si512();
  for (int v=0; v<5; v++){
    uint64_t t0=__rdtsc();
    for (long i=0;i<N;i++){
      int j = i & 3;
      if (v==0){ LD(2,B[0],64); LD(3,B[1],64); LD(4,A+64*j,astr); LD(5,A+64*j+32,astr); Z(0); Z(1); DP(0,4,2); DP(1,5,3); ST(0,C[0],64); ST(1,C[1],64); }
      if (v==1){ LD(2,B[0],64); LD(3,B[1],64); LD(4,A+64*j,astr); LD(5,A+64*j+32,astr); Z(0); Z(1); DP(0,4,2); DP(1,5,3); ST(0,C[0],64); ST(1,C[1],64);
                 for (int t=0;t<T;t++) acc = _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_load_si512(C[0]+16*t), _mm512_load_si512(C[1]+16*t))); }
      if (v==2){ // alternate C tiles 0,1 / 6,7
                 if (i&1){ LD(2,B[0],64); LD(3,B[1],64); LD(4,A+64*j,astr); LD(5,A+64*j+32,astr); Z(6); Z(7); DP(6,4,2); DP(7,5,3); ST(6,C[2],64); ST(7,C[3],64);}
                 else { LD(2,B[0],64); LD(3,B[1],64); LD(4,A+64*j,astr); LD(5,A+64*j+32,astr); Z(0); Z(1); DP(0,4,2); DP(1,5,3); ST(0,C[0],64); ST(1,C[1],64);} }
      if (v==3){ // only dp with zero, no loads
                 Z(0); Z(1); DP(0,4,2); DP(1,5,3); ST(0,C[0],64); ST(1,C[1],64); }
      if (v==4){ // dp only accumulate
                 DP(0,4,2); DP(1,5,3); DP(6,4,2); DP(7,5,3);}
    }
    uint64_t t1=__rdtsc();
    printf("T=%d variant %d: %.1f tsc cycles per step\n", T, v, (double)(t1-t0)/N);
  }
  int32_t o[16]; _mm512_storeu_si512(o, acc); return o[0]==12345;
}
