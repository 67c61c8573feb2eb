/* The float vectors (GCC/Clang vector extensions: AVX/AVX-512 or NEON code from one
 * source) the native kernels share: eight floats (sim_kernels.c's two-pass rows) and
 * sixteen (sim_prefill.c, sim_decode.c, sim_gemm.c: one AVX-512 register, two AVX2 ones,
 * four NEON ones, whichever clone the CPU picked), with their horizontal sums, maximum
 * and exp. Loads and stores through memcpy: no alignment assumed. */
#ifndef NPU_SIM_VEC_H
#define NPU_SIM_VEC_H

#include <stdint.h>
#include <string.h>

#include "sim_math.h"

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
 * hsum16, transpose16 below): LO_h keeps x's lanes with bit h clear and takes
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

/* x[i][l] -> x[l][i]: at each of four levels h the off-diagonal h x h blocks of every
 * 2h x 2h block swap places (rows i and i + h exchange their lanes with bit h set and
 * clear); after all four, every bit of the row and lane index has swapped. 64 two-input
 * shuffles for 256 elements instead of 256 scalar loads and stores (sim_prefill.c: 5-15%
 * off a prefill call, 16 prompts x 512 tokens, 2 KV heads of 32; sim_gemm.c's panels). */
#define SWAP_LEVEL(x, h, lo, hi)                            \
    for (int i = 0; i < 16; i++)                            \
        if (!(i & (h))) {                                   \
            const v16 a_ = (x)[i], b_ = (x)[i + (h)];       \
            (x)[i] = __builtin_shuffle(a_, b_, (lo));       \
            (x)[i + (h)] = __builtin_shuffle(a_, b_, (hi)); \
        }

static inline void transpose16(v16 x[16]) {
    SWAP_LEVEL(x, 8, LO8, HI8)
    SWAP_LEVEL(x, 4, LO4, HI4)
    SWAP_LEVEL(x, 2, LO2, HI2)
    SWAP_LEVEL(x, 1, LO1, HI1)
}

/* lane rotations within blocks of 16, 8, 4, 2: four rounds of an operation against the
 * rotated copy leave its reduction over all 16 lanes in every lane */
static const v16i ROT8 = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
static const v16i ROT4 = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
static const v16i ROT2 = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
static const v16i ROT1 = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};

static inline float hmax16(v16 x) {
    x = max16(x, __builtin_shuffle(x, ROT8));
    x = max16(x, __builtin_shuffle(x, ROT4));
    x = max16(x, __builtin_shuffle(x, ROT2));
    return max16(x, __builtin_shuffle(x, ROT1))[0];
}

static inline float hadd16(v16 x) {
    x += __builtin_shuffle(x, ROT8);
    x += __builtin_shuffle(x, ROT4);
    x += __builtin_shuffle(x, ROT2);
    return (x + __builtin_shuffle(x, ROT1))[0];
}

/* exp_nonpositive (sim_math.h) on 16 lanes: the same steps, floor through truncation */
static inline v16 exp16(v16 x) {
    x = max16(x, (v16){0} - 87.0f);
    const v16 t = x * 1.44269504088896341f + 0.5f;
    v16i ki = __builtin_convertvector(t, v16i);               /* toward zero */
    ki += (v16i)(__builtin_convertvector(ki, v16) > t);       /* -1 where that rounded up */
    const v16 k = __builtin_convertvector(ki, v16);
    const v16 p = EXP_POLY(EXP_REDUCE(x, k));
    return p * (v16)((ki + 127) << 23);
}

/* One round of the transposing sum: lanes of x and y added in pairs `w` apart, x's sums
 * in the first half of each block of 2w lanes, y's in the second. */
#define FOLD(x, y, lo, hi) (__builtin_shuffle((x), (y), (lo)) + __builtin_shuffle((x), (y), (hi)))

/* [sum(p[0]), ..., sum(p[15])] where p[i] holds its lanes at slot rev(i) of the input:
 * four rounds of FOLD leave the sum of input slot s in lane rev(s) (rev: 4-bit reversal),
 * so callers store key i's partial products at slot REV[i]. */
static const int REV[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

static inline v16 hsum16(const v16 p[16]) {
    v16 u[8], t[4], r[2];
    for (int i = 0; i < 8; i++) u[i] = FOLD(p[2 * i], p[2 * i + 1], LO8, HI8);
    for (int i = 0; i < 4; i++) t[i] = FOLD(u[2 * i], u[2 * i + 1], LO4, HI4);
    for (int i = 0; i < 2; i++) r[i] = FOLD(t[2 * i], t[2 * i + 1], LO2, HI2);
    return FOLD(r[0], r[1], LO1, HI1);
}

#endif
