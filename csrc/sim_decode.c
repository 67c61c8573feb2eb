/* The simulated NPU's decode attention for float32 caches: one query row (every query
 * head of one request) against its keys, read in place from the paged cache, in one pass.
 *
 * Same result as the two-pass row kernel (sim_kernels.c one_request), computed the way a
 * flash-decoding kernel does: keys in chunks of 16; for each KV head and each of its g
 * query heads, the chunk's 16 scores as one vector (16 dot products, then a transposing
 * horizontal sum), softmax online (running maximum and sum, rescaled per chunk), the
 * chunk's value rows accumulated while they sit in L1 next to their keys. No score row
 * is written out and read back, and every token row (all heads of K, then of V) is read
 * exactly once while it is hot. float32 caches, no rope, head dims in whole vectors of 16
 * (`decode_fits`); the others run in the two-pass kernel.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sim_math.h"
#include "sim_paged.h"
#include "sim_vec.h"

#define DC 16  /* keys per chunk: one vector of scores */

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

/* Token rows 4 KiB apart (8 KV heads of 128, say) put a chunk's 16 rows of a head into
 * one L1 set: measured 1.4x slower than the two-pass kernel (64 x 576 keys, 8 x 128),
 * which reads 8 rows at a time; those stay there. */
int decode_fits(const pd_args *a) {
    return !a->bf16 && a->R == 0 && a->D % 16 == 0 && a->Dv % 16 == 0 && a->row_of == NULL &&
           a->k_tok % 1024 != 0 && a->v_tok % 1024 != 0;
}

/* Lines of the rows (all heads) of the `count` tokens from position `pos` requested: the
 * request's keys lie in blocks scattered over the cache, so the hardware prefetcher,
 * which follows address streams, stalls at every block; asked PREFETCH_BYTES of rows
 * early, the loads are in flight while the current chunk computes. Into L2 (locality 1,
 * prefetcht2): measured 1.25x faster than into L1 (locality 3) or not at all on cold
 * caches, 8-64 KiB ahead alike. always_inline: a helper holding only prefetches is
 * "pure" to GCC's IPA, which then deletes its calls. */
#define PREFETCH_BYTES 16384
#define PF_LOC 1

static inline __attribute__((always_inline)) void prefetch_rows(const pd_args *a,
                                                                const int32_t *blocks,
                                                                int64_t pos, int64_t count) {
    int64_t c = pos / a->bs, o = pos % a->bs;
    const size_t kspan = (size_t)((a->H - 1) * a->k_head + a->D) * sizeof(float);
    const size_t vspan = (size_t)((a->H - 1) * a->v_head + a->Dv) * sizeof(float);
    while (count > 0) {
        /* the run of tokens left in this block: one span when token rows are adjacent */
        const int64_t run = a->bs - o < count ? a->bs - o : count;
        const float *k = (const float *)a->k + blocks[c] * a->k_blk + o * a->k_tok;
        const float *v = (const float *)a->v + blocks[c] * a->v_blk + o * a->v_tok;
        for (int64_t t = 0; t < run; t++) {
            for (size_t x = 0; x < kspan; x += 64)
                __builtin_prefetch((const char *)(k + t * a->k_tok) + x, 0, PF_LOC);
            for (size_t x = 0; x < vspan; x += 64)
                __builtin_prefetch((const char *)(v + t * a->v_tok) + x, 0, PF_LOC);
        }
        count -= run;
        o = 0;
        c++;
    }
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

/* The kernel, inlined once per head size (constant D and Dv unroll its inner loops). */
static inline __attribute__((always_inline)) void decode_body(const pd_args *a, int64_t b,
                                                              scratch *s, const int64_t D,
                                                              const int64_t Dv) {
    const int64_t N = a->N, H = a->H, g = N / H;
    const int64_t lo = a->first[b], n = a->lens[b] - lo;  /* n > 0: the caller's check */
    const int32_t *blocks = table_row(a, b);
    float *restrict qs = s->q, *restrict acc = s->acc;
    float mx[N], sm[N];
    for (int64_t i = 0; i < N; i++) {
        const float *qv = a->q + (b * N + i) * D;
        for (int64_t d = 0; d < D; d++) qs[i * D + d] = qv[d] * a->scale;
        mx[i] = -INFINITY;
        sm[i] = 0.0f;
    }
    memset(acc, 0, (size_t)(N * Dv) * sizeof(float));
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const int64_t row_bytes = (H * D + H * Dv) * (int64_t)sizeof(float);
    const int64_t ahead = DC + PREFETCH_BYTES / row_bytes;
    prefetch_rows(a, blocks, lo, n < ahead ? n : ahead);
    int64_t c = lo / a->bs, o = lo % a->bs;  /* block slot and offset of the chunk's key */
    for (int64_t t0 = 0; t0 < n; t0 += DC) {
        const int64_t m = n - t0 < DC ? n - t0 : DC;
        if (t0 + ahead < n) {
            const int64_t left = n - t0 - ahead;
            prefetch_rows(a, blocks, lo + t0 + ahead, left < DC ? left : DC);
        }
        /* the chunk's token rows (head 0); past the request's end the last one again,
         * whose score then repeats (the maximum stays right) and whose weight is zeroed */
        const float *krow[DC], *vrow[DC];
        for (int64_t i = 0; i < DC; i++) {
            if (i >= m) {
                krow[i] = krow[m - 1];
                vrow[i] = vrow[m - 1];
                continue;
            }
            krow[i] = (const float *)a->k + blocks[c] * a->k_blk + o * a->k_tok;
            vrow[i] = (const float *)a->v + blocks[c] * a->v_blk + o * a->v_tok;
            if (++o == a->bs) o = 0, c++;
        }
        for (int64_t h = 0; h < H; h++) {
            const float *kh[DC], *vh[DC];
            for (int i = 0; i < DC; i++) {
                kh[i] = krow[i] + h * a->k_head;
                vh[i] = vrow[i] + h * a->v_head;
            }
            for (int64_t j = 0; j < g; j++) {
                const int64_t qn = h * g + j;
                const float *q = qs + qn * D;
                /* scores: key i's products at slot REV[i], summed across in hsum16 */
                v16 part[DC];
                for (int i = 0; i < DC; i++) {
                    const float *k = kh[i];
                    v16 x = ld16(q) * ld16(k);
                    for (int64_t d = 16; d < D; d += 16) x += ld16(q + d) * ld16(k + d);
                    part[REV[i]] = x;
                }
                const v16 sc = hsum16(part);
                const float top = hmax16(sc);
                const float mnew = top > mx[qn] ? top : mx[qn];
                const float alpha = mnew == mx[qn] ? 1.0f
                                    : mx[qn] == -INFINITY ? 0.0f
                                    : exp_nonpositive(mx[qn] - mnew);
                /* weights; the repeats past the request's end zeroed */
                const v16 w = (v16)((v16i)exp16(sc - mnew) & (lane < (int32_t)m));
                float p[DC];
                st16(p, w);
                sm[qn] = sm[qn] * alpha + hadd16(w);
                mx[qn] = mnew;
                /* acc += p . V: sixteen values at a time in registers, keys in pairs */
                float *restrict ar = acc + qn * Dv;
                for (int64_t d = 0; d < Dv; d += 16) {
                    v16 x = ld16(ar + d) * alpha, y = {0};
                    for (int i = 0; i < DC; i += 2) {
                        x += p[i] * ld16(vh[i] + d);
                        y += p[i + 1] * ld16(vh[i + 1] + d);
                    }
                    st16(ar + d, x + y);
                }
            }
        }
    }
    float *out = a->out + b * N * Dv;
    for (int64_t i = 0; i < N; i++) {
        const float inv = 1.0f / sm[i];
        for (int64_t d = 0; d < Dv; d++) out[i * Dv + d] = acc[i * Dv + d] * inv;
        if (a->lse) a->lse[b * N + i] = mx[i] + logf(sm[i]);
    }
}

CLONES
void decode_row(const pd_args *a, int64_t b, scratch *s) {
    /* the common head sizes with their loops unrolled; the rest as they come */
    if (a->D == 32 && a->Dv == 32)
        decode_body(a, b, s, 32, 32);
    else if (a->D == 64 && a->Dv == 64)
        decode_body(a, b, s, 64, 64);
    else if (a->D == 128 && a->Dv == 128)
        decode_body(a, b, s, 128, 128);
    else
        decode_body(a, b, s, a->D, a->Dv);
}
