/* The simulated NPU's prefill attention: a tile of consecutive query rows of one request
 * against its keys, read in place from the paged cache (npu_fused_infer_attention_score's
 * TND rows of more than one token: prefill, chunked prefill, prefix-cache hits).
 *
 * Same result as the per-row kernel (sim_kernels.c one_request), computed the way a
 * flash-attention kernel does: keys in chunks of KC, each chunk's K transposed once and
 * its scores for every row of the tile (m rows x g query heads of one KV head) formed as
 * a small matrix product; softmax online (running maximum and sum, rescaled per chunk).
 * Row r sees the keys [first[r], lens[r]); the caller puts the causal / band limits
 * there, masked keys weigh exactly 0. float32 caches without rope only (`tile_fits`); the
 * others run row by row.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sim_math.h"
#include "sim_paged.h"
#include "sim_vec.h"

#define KC 32          /* keys per chunk (two vectors of 16) */
#define TILE_HEADS 64  /* rows x query heads of one KV head per tile, at most */
#define TILE_ROWS 16

/* max of lanes j in [f, e) of the 32 scores s0 | s1 (-inf when none) */
static inline float masked_max(v16 s0, v16 s1, int64_t f, int64_t e) {
    const v16i j0 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, j1 = j0 + 16;
    const v16i ninf = (v16i)((v16){0} - INFINITY);
    const int32_t lo = (int32_t)f, hi = (int32_t)e;
    const v16i in0 = (j0 >= lo) & (j0 < hi), in1 = (j1 >= lo) & (j1 < hi);
    v16 m = max16((v16)(((v16i)s0 & in0) | (ninf & ~in0)),
                  (v16)(((v16i)s1 & in1) | (ninf & ~in1)));
    float top = -INFINITY;
    for (int k = 0; k < 16; k += 4) {  /* four short chains, then theirs */
        const float a = m[k] > m[k + 1] ? m[k] : m[k + 1];
        const float b = m[k + 2] > m[k + 3] ? m[k + 2] : m[k + 3];
        const float c = a > b ? a : b;
        top = c > top ? c : top;
    }
    return top;
}

/* x[i][l] -> x[l][i]: at each of four levels h the off-diagonal h x h blocks of every
 * 2h x 2h block swap places (rows i and i + h exchange their lanes with bit h set and
 * clear); after all four, every bit of the row and lane index has swapped. 64 two-input
 * shuffles for 256 elements instead of 256 scalar loads and stores: 5-15% off a prefill
 * call (16 prompts x 512 tokens, 2 KV heads of 32), bitwise the same result. */
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

/* float32 caches, no rope, value rows in whole vectors */
int tile_fits(const pd_args *a) {
    return !a->bf16 && a->R == 0 && a->Dv % 16 == 0 && a->row_of != NULL;
}

int64_t tile_rows(const pd_args *a) {
    const int64_t g = a->N / a->H, m = TILE_HEADS / (g > 0 ? g : 1);
    return m < 1 ? 1 : m > TILE_ROWS ? TILE_ROWS : m;
}

CLONES
int prefill_tile(const pd_args *a, int64_t r0, int64_t m, scratch *s) {
    const int64_t N = a->N, H = a->H, D = a->D, Dv = a->Dv, g = N / H, M = m * g;
    const float *kc = a->k, *vc = a->v;
    /* buffers: q [M, D], kt [D, KC], sc [M, KC], acc [M, Dv], mx [M], sm [M] */
    if (grow(&s->tile, &s->cap_tile, (size_t)(M * D + D * KC + M * KC + M * Dv + 2 * M)))
        return -1;
    float *restrict qs = s->tile, *restrict kt = qs + M * D, *restrict sc = kt + D * KC;
    float *restrict acc = sc + M * KC, *restrict mx = acc + M * Dv, *restrict sm = mx + M;
    const int32_t *blocks = table_row(a, r0);
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t r = r0; r < r0 + m; r++)
        if (a->lens[r] > a->first[r]) {
            lo = a->first[r] < lo ? a->first[r] : lo;
            hi = a->lens[r] > hi ? a->lens[r] : hi;
        }
    for (int64_t h = 0; h < H; h++) {
        /* tile row i: query row r0 + i / g, head h * g + i % g */
        for (int64_t i = 0; i < M; i++) {
            const float *qv = a->q + ((r0 + i / g) * N + h * g + i % g) * D;
            for (int64_t d = 0; d < D; d++) qs[i * D + d] = qv[d] * a->scale;
            mx[i] = -INFINITY;
            sm[i] = 0.0f;
        }
        memset(acc, 0, (size_t)(M * Dv) * sizeof(float));
        for (int64_t c0 = lo; c0 < hi; c0 += KC) {
            const int64_t kn = hi - c0 < KC ? hi - c0 : KC;
            const float *vrow[KC], *krow[KC];
            for (int64_t j = 0; j < kn; j++) {
                const int64_t pos = c0 + j, blk = blocks[pos / a->bs], off = pos % a->bs;
                krow[j] = kc + blk * a->k_blk + off * a->k_tok + h * a->k_head;
                vrow[j] = vc + blk * a->v_blk + off * a->v_tok + h * a->v_head;
            }
            if (kn == KC && D % 16 == 0) {
                /* a whole chunk: 16 x 16 blocks transposed in registers */
                for (int64_t j0 = 0; j0 < KC; j0 += 16)
                    for (int64_t d0 = 0; d0 < D; d0 += 16) {
                        v16 x[16];
                        for (int i = 0; i < 16; i++) x[i] = ld16(krow[j0 + i] + d0);
                        transpose16(x);
                        for (int i = 0; i < 16; i++) st16(kt + (d0 + i) * KC + j0, x[i]);
                    }
            } else {
                for (int64_t j = 0; j < KC; j++)
                    for (int64_t d = 0; d < D; d++) kt[d * KC + j] = j < kn ? krow[j][d] : 0.0f;
            }
            for (int64_t i = 0; i < M; i++) {
                const int64_t r = r0 + i / g;
                const int64_t f = a->first[r] - c0, e = a->lens[r] - c0 < kn ? a->lens[r] - c0 : kn;
                if (e <= 0 || f >= e) continue;  /* no key of this chunk */
                /* scores of the chunk's KC keys: two vectors, kept in registers */
                /* (even and odd d in separate sums: four independent FMA chains) */
                v16 s0 = {0}, s1 = {0}, t0 = {0}, t1 = {0};
                const float *qi = qs + i * D;
                int64_t d = 0;
                for (; d + 1 < D; d += 2) {
                    s0 += qi[d] * ld16(kt + d * KC);
                    s1 += qi[d] * ld16(kt + d * KC + 16);
                    t0 += qi[d + 1] * ld16(kt + (d + 1) * KC);
                    t1 += qi[d + 1] * ld16(kt + (d + 1) * KC + 16);
                }
                if (d < D) {
                    s0 += qi[d] * ld16(kt + d * KC);
                    s1 += qi[d] * ld16(kt + d * KC + 16);
                }
                s0 += t0;
                s1 += t1;
                float *restrict p = sc + i * KC;
                st16(p, s0);
                st16(p + 16, s1);
                const float top = masked_max(s0, s1, f, e);
                const float mnew = top > mx[i] ? top : mx[i];
                const float alpha = mx[i] == -INFINITY ? 0.0f : exp_nonpositive(mx[i] - mnew);
                float total = 0.0f;
#pragma omp simd reduction(+ : total)
                for (int64_t j = 0; j < KC; j++) {
                    /* every lane computed (the loop vectorises), masked ones zeroed */
                    const float z = p[j] - mnew;
                    const float x = exp_nonpositive(z < 0.0f ? z : 0.0f);
                    p[j] = j >= f && j < e ? x : 0.0f;
                    total += p[j];
                }
                sm[i] = sm[i] * alpha + total;
                mx[i] = mnew;
                /* acc row += p . V, sixteen values of the row at a time in a register */
                float *restrict ar = acc + i * Dv;
                const int64_t j0 = f > 0 ? f : 0;
                for (int64_t d0 = 0; d0 < Dv; d0 += 32) {
                    /* 32 values (16 when Dv is an odd multiple of 16), keys in pairs: up
                     * to four independent FMA chains */
                    const int two = d0 + 32 <= Dv;
                    v16 xa = ld16(ar + d0) * alpha, ya = {0}, xb = {0}, yb = {0};
                    if (two) xb = ld16(ar + d0 + 16) * alpha;
                    int64_t j = j0;
                    for (; j + 1 < e; j += 2) {
                        xa += p[j] * ld16(vrow[j] + d0);
                        ya += p[j + 1] * ld16(vrow[j + 1] + d0);
                        if (two) {
                            xb += p[j] * ld16(vrow[j] + d0 + 16);
                            yb += p[j + 1] * ld16(vrow[j + 1] + d0 + 16);
                        }
                    }
                    if (j < e) {
                        xa += p[j] * ld16(vrow[j] + d0);
                        if (two) xb += p[j] * ld16(vrow[j] + d0 + 16);
                    }
                    st16(ar + d0, xa + ya);
                    if (two) st16(ar + d0 + 16, xb + yb);
                }
            }
        }
        for (int64_t i = 0; i < M; i++) {
            const int64_t r = r0 + i / g, n = h * g + i % g;
            float *o = a->out + (r * N + n) * Dv;
            const float inv = sm[i] > 0.0f ? 1.0f / sm[i] : 0.0f;
            for (int64_t d = 0; d < Dv; d++) o[d] = acc[i * Dv + d] * inv;
            if (a->lse) a->lse[r * N + n] = sm[i] > 0.0f ? mx[i] + logf(sm[i]) : -INFINITY;
        }
    }
    return 0;
}
