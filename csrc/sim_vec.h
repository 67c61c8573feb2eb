/* Sixteen-float vectors (GCC vector extensions) the attention kernels (sim_prefill.c,
 * sim_decode.c) share: one AVX-512 register, two AVX2 ones, four NEON ones, whichever
 * clone the CPU picked. Loads and stores through memcpy: no alignment assumed. */
#ifndef NPU_SIM_VEC_H
#define NPU_SIM_VEC_H

#include <stdint.h>
#include <string.h>

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

#endif
