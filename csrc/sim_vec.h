/* The float vectors (GCC/Clang vector extensions: AVX/AVX-512 or NEON code from one
 * source) the attention kernels share: eight floats (sim_kernels.c's two-pass rows) and
 * sixteen (sim_prefill.c, sim_decode.c: one AVX-512 register, two AVX2 ones, four NEON
 * ones, whichever clone the CPU picked). Loads and stores through memcpy: no alignment
 * assumed. */
#ifndef NPU_SIM_VEC_H
#define NPU_SIM_VEC_H

#include <stdint.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 x;
    memcpy(&x, p, sizeof x);
    return x;
}

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16 ld16(const float *p) {
    v16 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void st16(float *p, v16 x) { memcpy(p, &x, sizeof x); }

static inline v16 max16(v16 x, v16 y) {
    const v16i take = x > y;
    return (v16)(((v16i)x & take) | ((v16i)y & ~take));
}

/* Two-input shuffle masks (__builtin_shuffle(x, y, m): m < 16 picks x, 16.. picks y) of
 * the four levels h = 8, 4, 2, 1 of the pairwise reductions and transposes (sim_decode.c
 * hsum16, sim_prefill.c transpose16): LO_h keeps x's lanes with bit h clear and takes
 * y's lanes h lower into the others; HI_h takes x's lanes h higher into those with bit h
 * clear and keeps y's in the others. */
static const v16i LO8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
static const v16i HI8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
static const v16i LO4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
static const v16i HI4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
static const v16i LO2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
static const v16i HI2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
static const v16i LO1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
static const v16i HI1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};

#endif
