/* What the simulated NPU's native kernels (sim_kernels.c, sim_rows.c) share: the export and
 * CPU-clone attributes, and arithmetic. */
#ifndef NPU_SIM_MATH_H
#define NPU_SIM_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* Vector clones for x86-64 (AVX-512, AVX2+FMA) chosen at load time by the CPU, so one
 * wheel runs everywhere at the speed of the machine; aarch64's NEON is its baseline. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

/* exp(x) for x <= 0 within ~2 ulp: x = k ln2 + r, |r| <= ln2 / 2, degree-7 Taylor
 * polynomial for e^r, 2^k put into the exponent bits. Arguments below -87 give ~1e-38
 * (never a denormal, whose arithmetic is ~100x slower on x86). The two steps as macros,
 * so that the vector version (sim_decode.c exp16) is the same arithmetic on 16 lanes. */
#define EXP_REDUCE(x, k) ((x) - (k) * 0.693359375f + (k) * 2.12194440e-4f) /* ln2 hi/lo */
#define EXP_POLY(r)                                                                   \
    (((((((((r) * (1.0f / 5040.0f) + 1.0f / 720.0f) * (r) + 1.0f / 120.0f) * (r) +   \
          1.0f / 24.0f) * (r) + 1.0f / 6.0f) * (r) + 0.5f) * (r) + 1.0f) * (r)) + 1.0f)

static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float k = floorf(x * 1.44269504088896341f + 0.5f);
    const float p = EXP_POLY(EXP_REDUCE(x, k));
    const int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

#endif
