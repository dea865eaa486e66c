#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <immintrin.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
typedef struct __attribute__((aligned(64))) { uint8_t palette_id, start_row; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static volatile long bad = 0, iters_total = 0;
static void * worker(void * arg) {
  long id = (long) arg;
  cfg_t c; memset(&c, 0, sizeof c); c.palette_id = 1;
  c.rows[0]=8; c.colsb[0]=64; // C 8 tok x 16 int32
  c.rows[1]=8; c.colsb[1]=32; // A 8 tok x 32 bytes
  c.rows[2]=8; c.colsb[2]=64; // B 8 (K/4) x 64 bytes
  _tile_loadconfig(&c);
  int8_t a[8*32]; uint8_t b[8*64]; int32_t out[8*16];
  long it = 0;
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    for (int i=0;i<8*32;i++) a[i]=(int8_t)((i*7+it+id)%255-127);
    for (int i=0;i<8*64;i++) b[i]=(uint8_t)((i*13+it)%16);
    _tile_zero(0); _tile_loadd(1, a, 32); _tile_loadd(2, b, 64);
    _tile_dpbsud(0, 1, 2);
    if (it % 1000 == 0) { struct timespec s={0,100000}; nanosleep(&s, NULL); }
    _tile_stored(0, out, 64);
    for (int t=0;t<8;t++) for (int n=0;n<16;n++) { int32_t s=0; for (int k=0;k<32;k++) s += a[t*32+k]*b[(k/4)*64+n*4+(k%4)]; if (s!=out[t*16+n]) bad++; }
    it++;
    clock_gettime(CLOCK_MONOTONIC, &t1);
  } while ((t1.tv_sec-t0.tv_sec) < 5);
  __sync_fetch_and_add(&iters_total, it);
  _tile_release();
  return NULL;
}
int main(void){
  long r = syscall(SYS_arch_prctl, 0x1023, 18);
  printf("prctl=%ld\n", r);
  pthread_t th[3];
  for (long i=0;i<3;i++) pthread_create(&th[i], NULL, worker, (void*)i);
  for (int i=0;i<3;i++) pthread_join(th[i], NULL);
  printf("iters=%ld bad=%ld\n", iters_total, bad);
}
