// Which instructions take a vpdpbusd slot? Eight independent zmm vpdpbusd chains per iteration, alone and with
// two or four other instructions (independent of them) added; the time per iteration, best of 5 runs of 2e7
// iterations, in ns and in cycles at the nominal 3.55 GHz. An added instruction that costs time shares the
// multiply-add pipes with vpdpbusd; one that costs nothing runs on other pipes. Build and run (one core):
//   gcc -O2 -march=native docs/bench/kernels-v15-zen4/pipes.c -o /tmp/pipes && /tmp/pipes
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 20000000L
#define RUN(name, extra, nx) { __m512i a0=u,a1=u,a2=u,a3=u,a4=u,a5=u,a6=u,a7=u; __m512 f0=g,f1=g,f2=g,f3=g; double best=1e9; \
  for (int r=0;r<5;r++){ double t=now(); for(long i=0;i<N;i++){ __asm__ volatile( \
   "vpdpbusd %12,%13,%0\n vpdpbusd %12,%13,%1\n vpdpbusd %12,%13,%2\n vpdpbusd %12,%13,%3\n" \
   "vpdpbusd %12,%13,%4\n vpdpbusd %12,%13,%5\n vpdpbusd %12,%13,%6\n vpdpbusd %12,%13,%7\n" extra \
   :"+v"(a0),"+v"(a1),"+v"(a2),"+v"(a3),"+v"(a4),"+v"(a5),"+v"(a6),"+v"(a7),"+v"(f0),"+v"(f1),"+v"(f2),"+v"(f3):"v"(s),"v"(u),"v"(g)); } \
   double dt=now()-t; if(dt<best)best=dt;} \
  printf("%-28s %.2f ns per 8 vpdpbusd (+%d others) = %.2f cycles at 3.55 GHz\n", name, best/N*1e9, nx, best/N*1e9*3.55); }
int main(void){
  __m512i u=_mm512_set1_epi32(0x01020304), s=_mm512_set1_epi32(0x01010101); __m512 g=_mm512_set1_ps(1.0f);
  for (int rep=0; rep<2; rep++) {
  RUN("alone", "", 0)
  RUN("+2 vfmadd231ps", "vfmadd231ps %14,%14,%8\n vfmadd231ps %14,%14,%9\n", 2)
  RUN("+4 vfmadd231ps", "vfmadd231ps %14,%14,%8\n vfmadd231ps %14,%14,%9\n vfmadd231ps %14,%14,%10\n vfmadd231ps %14,%14,%11\n", 4)
  RUN("+2 vpdpwssd", "vpdpwssd %12,%13,%8\n vpdpwssd %12,%13,%9\n", 2)
  RUN("+2 vpmaddwd", "vpmaddwd %12,%13,%8\n vpmaddwd %12,%13,%9\n", 2)
  RUN("+2 vcvtdq2ps", "vcvtdq2ps %13,%8\n vcvtdq2ps %13,%9\n", 2)
  RUN("+2 vpslld", "vpslld $4,%13,%8\n vpslld $4,%13,%9\n", 2)
  RUN("+2 vpsrlw+2 vpandd", "vpsrlw $4,%13,%8\n vpsrlw $4,%13,%9\n vpandd %12,%13,%10\n vpandd %12,%13,%11\n", 4)
  RUN("+2 vpblendmw", "vpblendmw %12,%13,%8%{%%k1%}\n vpblendmw %12,%13,%9%{%%k1%}\n", 2)
  }
  return 0;
}
