/* The simulated NPU's decode attention for float32 caches: one query row (every query
 * head of one request) against its keys, read in place from the paged cache.
 *
 * Same result as the general row kernel (sim_kernels.c one_request), computed in two
 * passes over keys in chunks of 16. Pass 1: for each KV head and each of its g query
 * heads, a chunk's 16 scores as one vector (16 dot products, then a transposing
 * horizontal sum), stored to the row's score scratch (N x up to 16 x ceil(n / 16)
 * floats: a few KiB, in L1) with a running vector maximum. Then one softmax per head
 * over its stored scores, and pass 2 accumulates the value rows weighted by them. Each
 * K row and each V row is read once. Against the one-pass online softmax this replaced
 * (a maximum, exp and rescale chained through every chunk and head), 128 requests x
 * 129-256 keys, 4 x 32 heads over 2 KV heads, two threads: 0.38-0.53 -> 0.31-0.36 ms
 * with the caches warm, 0.82-1.06 -> 0.56-0.94 ms cold. float32 caches, no rope, head
 * dims in whole vectors of 16 (`decode_fits`); the others run in the general kernel.
 *
 * A chunk inside one block is addressed from its first row (chunk_rows), pass 2 loads a
 * chunk's value vectors once for the g query heads that read them, and rows lying back
 * to back are prefetched as one range. Same batch, best of 8 alternated runs: K/V in L2
 * 254 -> 204 us, in L3 284 -> 238, from memory 577 -> 525; in the engine (128 x (128 +
 * 128)) 421 -> 402 us per layer. From memory it streams at ~24 GB/s against ~45 for a
 * plain two-thread read on this host: a variant doing the loads without the arithmetic
 * took 445 us.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sim_math.h"
#include "sim_paged.h"
#include "sim_vec.h"

#define DC 16  /* keys per chunk: one vector of scores */

/* Token rows 4 KiB apart (8 KV heads of 128, say) put a chunk's 16 rows of a head into
 * one L1 set: measured 1.4x slower than the general kernel (64 x 576 keys, 8 x 128),
 * which reads 8 rows at a time; those stay there. */
int decode_fits(const pd_args *a) {
    return !a->bf16 && a->R == 0 && a->D % 16 == 0 && a->Dv % 16 == 0 && a->row_of == NULL &&
           a->k_tok % 1024 != 0 && a->v_tok % 1024 != 0;
}

/* Token rows (all heads) are requested ahead of their use: a request's keys lie in
 * blocks scattered over the cache, so the hardware prefetcher, which follows address
 * streams, stalls at every block; asked PREFETCH_BYTES of rows early, the loads are in
 * flight while the current chunk computes. Into L2 (locality 1, prefetcht2): measured
 * 1.25x faster than into L1 (locality 3) or not at all on cold caches, 8-64 KiB ahead
 * alike (prefetchnta, locality 0: no faster in the engine). always_inline: a helper holding only prefetches is
 * "pure" to GCC's IPA, which then deletes its calls. */
#define PREFETCH_BYTES 16384
#define PF_LOC 1

/* The lines of one cache's token rows [pos, pos + count) of a request. */
static inline __attribute__((always_inline)) void prefetch_cache(const pd_args *a,
        const float *base, int64_t blk, int64_t tok, size_t span, const int32_t *blocks,
        int64_t pos, int64_t count) {
    int64_t c = pos / a->bs, o = pos % a->bs;
    while (count > 0) {
        const int64_t run = a->bs - o < count ? a->bs - o : count;
        const float *r = base + blocks[c] * blk + o * tok;
        if (span >= (size_t)tok * sizeof(float)) {  /* rows back to back: one range */
            const char *p = (const char *)r;
            const char *end = (const char *)(r + (run - 1) * tok) + span;
            for (; p < end; p += 64) __builtin_prefetch(p, 0, PF_LOC);
        } else {
            for (int64_t t = 0; t < run; t++)
                for (size_t x = 0; x < span; x += 64)
                    __builtin_prefetch((const char *)(r + t * tok) + x, 0, PF_LOC);
        }
        count -= run;
        o = 0;
        c++;
    }
}

/* Rows [u, u + count) of the request's n K rows followed by its n V rows, in the order
 * the two passes read them (none past 2n). */
static inline __attribute__((always_inline)) void prefetch_kv(const pd_args *a,
        const int32_t *blocks, int64_t lo, int64_t n, int64_t u, int64_t count) {
    const size_t kspan = (size_t)((a->H - 1) * a->k_head + a->D) * sizeof(float);
    const size_t vspan = (size_t)((a->H - 1) * a->v_head + a->Dv) * sizeof(float);
    if (u >= 2 * n) return;
    if (u + count > 2 * n) count = 2 * n - u;
    if (u < n) {
        const int64_t kc = n - u < count ? n - u : count;
        prefetch_cache(a, a->k, a->k_blk, a->k_tok, kspan, blocks, lo + u, kc);
        u += kc;
        count -= kc;
    }
    if (count > 0)
        prefetch_cache(a, a->v, a->v_blk, a->v_tok, vspan, blocks, lo + u - n, count);
}

/* The DC token rows of a chunk (head 0) of one cache, m of them the request's, its block
 * slot *c and offset *o stepped past them. A whole chunk inside one block (every chunk of
 * a row that starts a block, block sizes being multiples of 16) returns its first row:
 * the others follow tok apart, one pointer where sixteen would not fit in registers
 * (measured 10-20% faster). Otherwise NULL, with the rows in `rows`: the DC - m after the
 * request's end repeat its last row (their scores repeat, their weights are zeroed). */
static inline const float *chunk_rows(const pd_args *a, const void *base, int64_t blk,
                                      int64_t tok, const int32_t *blocks, int64_t *c,
                                      int64_t *o, int64_t m, const float *rows[DC]) {
    if (m == DC && *o + DC <= a->bs) {
        const float *first = (const float *)base + blocks[*c] * blk + *o * tok;
        if ((*o += DC) == a->bs) *o = 0, ++*c;
        return first;
    }
    for (int64_t i = 0; i < DC; i++) {
        if (i >= m) {
            rows[i] = rows[m - 1];
            continue;
        }
        rows[i] = (const float *)base + blocks[*c] * blk + *o * tok;
        if (++*o == a->bs) *o = 0, ++*c;
    }
    return NULL;
}

/* Key i's row of a chunk (head 0): as chunk_rows gave it, `rows` or (rows NULL) `first`
 * and the rows tok after it. */
static inline __attribute__((always_inline)) const float *chunk_row(const float *const *rows,
        const float *first, int64_t tok, int i) {
    return rows ? rows[i] : first + i * tok;
}

/* Pass 1 over one chunk: every query head's DC scores into sc, their running maximum. */
static inline __attribute__((always_inline)) void score_chunk(const pd_args *a,
        const float *restrict qs, float *restrict sc, v16 *vmax, int64_t np, int64_t t0,
        const int64_t D, const float *const *rows, const float *first) {
    const int64_t g = a->N / a->H;
    for (int64_t h = 0; h < a->H; h++) {
        for (int64_t j = 0; j < g; j++) {
            const int64_t qn = h * g + j;
            const float *q = qs + qn * D;
            v16 part[DC];  /* key i's products at slot REV[i], summed across in hsum16 */
            for (int i = 0; i < DC; i++) {
                const float *k = chunk_row(rows, first, a->k_tok, i) + h * a->k_head;
                v16 x = ld16(q) * ld16(k);
                for (int64_t d = 16; d < D; d += 16) x += ld16(q + d) * ld16(k + d);
                part[REV[i]] = x;
            }
            const v16 v = hsum16(part);
            vmax[qn] = max16(vmax[qn], v);
            st16(sc + qn * np + t0, v);
        }
    }
}

/* Pass 2 over one chunk: acc += weights . V for every query head. */
static inline __attribute__((always_inline)) void value_chunk(const pd_args *a,
        const float *restrict sc, float *restrict acc, int64_t np, int64_t t0,
        const int64_t Dv, const float *const *rows, const float *first) {
    const int64_t g = a->N / a->H;
    for (int64_t h = 0; h < a->H; h++) {
        for (int64_t d = 0; d < Dv; d += 16) {
            v16 vv[DC];  /* loaded once for the g query heads that read them */
            for (int i = 0; i < DC; i++)
                vv[i] = ld16(chunk_row(rows, first, a->v_tok, i) + h * a->v_head + d);
            for (int64_t j = 0; j < g; j++) {
                const int64_t qn = h * g + j;
                const float *p = sc + qn * np + t0;
                float *restrict ar = acc + qn * Dv;
                v16 x = ld16(ar + d), y = {0};
                for (int i = 0; i < DC; i += 2) {
                    x += p[i] * vv[i];
                    y += p[i + 1] * vv[i + 1];
                }
                st16(ar + d, x + y);
            }
        }
    }
}

/* The kernel, inlined once per head size (constant D and Dv unroll its inner loops). */
static inline __attribute__((always_inline)) void decode_body(const pd_args *a, int64_t b,
                                                              scratch *s, const int64_t D,
                                                              const int64_t Dv) {
    const int64_t N = a->N, H = a->H;
    const int64_t lo = a->first[b], n = a->lens[b] - lo;  /* n > 0: the caller's check */
    const int64_t np = (n + DC - 1) / DC * DC;
    const int32_t *blocks = table_row(a, b);
    float *restrict qs = s->q, *restrict acc = s->acc, *restrict sc = s->scores;
    float mx[N], sm[N];
    v16 vmax[N];
    for (int64_t i = 0; i < N; i++) {
        const float *qv = a->q + (b * N + i) * D;
        for (int64_t d = 0; d < D; d++) qs[i * D + d] = qv[d] * a->scale;
        vmax[i] = (v16){0} - INFINITY;
    }
    memset(acc, 0, (size_t)(N * Dv) * sizeof(float));
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const int64_t krow_bytes = H * D * (int64_t)sizeof(float);
    const int64_t ahead = DC + PREFETCH_BYTES / krow_bytes;
    prefetch_kv(a, blocks, lo, n, 0, ahead);
    int64_t c = lo / a->bs, o = lo % a->bs;
    /* pass 1: scores, K rows in chunks of DC; past the row's end the last row again, whose
     * score repeats (the maximum stays right) and whose weight is zeroed below */
    for (int64_t t0 = 0; t0 < n; t0 += DC) {
        const int64_t m = n - t0 < DC ? n - t0 : DC;
        prefetch_kv(a, blocks, lo, n, t0 + ahead, DC);
        const float *krow[DC];
        const float *first = chunk_rows(a, a->k, a->k_blk, a->k_tok, blocks, &c, &o, m, krow);
        if (first)  /* two calls: each inlined for its kind of rows */
            score_chunk(a, qs, sc, vmax, np, t0, D, NULL, first);
        else
            score_chunk(a, qs, sc, vmax, np, t0, D, krow, NULL);
    }
    /* softmax weights in place of the scores; lanes past the row's end zeroed */
    for (int64_t i = 0; i < N; i++) {
        mx[i] = hmax16(vmax[i]);
        v16 sum = {0};
        float *row = sc + i * np;
        for (int64_t t0 = 0; t0 < n; t0 += DC) {
            const v16i live = lane < (int32_t)(n - t0);
            const v16 w = (v16)((v16i)exp16(ld16(row + t0) - mx[i]) & live);
            st16(row + t0, w);
            sum += w;
        }
        sm[i] = hadd16(sum);
    }
    /* pass 2: acc += weights . V, sixteen values at a time in registers, keys in pairs */
    c = lo / a->bs, o = lo % a->bs;
    const int64_t vahead = DC + PREFETCH_BYTES / (H * Dv * (int64_t)sizeof(float));
    for (int64_t t0 = 0; t0 < n; t0 += DC) {
        const int64_t m = n - t0 < DC ? n - t0 : DC;
        /* past this row's last value rows, the first keys of the row run next */
        const int64_t u = n + t0 + vahead;
        if (u < 2 * n) {
            prefetch_kv(a, blocks, lo, n, u, DC);
        } else if (s->next >= 0) {
            const int64_t nb = s->next, nlo = a->first[nb], nn = a->lens[nb] - nlo;
            if (nn > 0) prefetch_kv(a, table_row(a, nb), nlo, nn, u - 2 * n, DC);
        }
        const float *vrow[DC];
        const float *first = chunk_rows(a, a->v, a->v_blk, a->v_tok, blocks, &c, &o, m, vrow);
        if (first)
            value_chunk(a, sc, acc, np, t0, Dv, NULL, first);
        else
            value_chunk(a, sc, acc, np, t0, Dv, vrow, NULL);
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
