/* The simulated NPU's prefill attention: a tile of consecutive query rows of one request
 * against its keys, read in place from the paged cache (npu_fused_infer_attention_score's
 * TND rows of more than one token: prefill, chunked prefill, prefix-cache hits).
 *
 * Same result as the per-row kernel (sim_kernels.c one_request), computed the way a
 * flash-attention kernel does, over spans of up to SPAN keys: the span's K transposed once
 * (in chunks of KC keys), then per register block of RB tile rows (m rows x g query heads
 * of one KV head) three passes: the scores of every chunk the block sees (each loaded K^T
 * vector feeds RB rows' multiply-adds; -inf outside a row's keys, masks only on a chunk
 * the row sees in part), each row's maximum and probabilities once per span (exp16 on
 * whole vectors), then p . V (each V vector loaded once for the RB rows). Across spans the
 * softmax is online (running maximum and sum, the accumulators rescaled once per span).
 * Against the softmax per 32-key chunk before 6969494: 16 x 512 causal 12.4 -> 9.5 ms,
 * 8 x 1024 24.4 -> 18.2 ms, 64 x 128 4.75 -> 4.3 ms (two threads, Zen 4); 32-row tiles
 * and a block's last chunk cut to the vector its keys end in: another 6-8%.
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

#define KC 32          /* keys per chunk (two vectors of 16; 64 measured slower at 128-token
                        * prompts: more of the diagonal chunk masked) */
#define KV (KC / 16)
#define TILE_HEADS 64  /* rows x query heads of one KV head per tile, at most */
#define TILE_ROWS 32  /* with spans, 6-8% faster than 16 (fewer K transposes per key) */
#define RB 4           /* tile rows per register block (8 measured the same) */
#define SPAN 512       /* keys per softmax span (its scores: RB x SPAN floats per block) */

/* float32 caches, no rope, value rows in whole vectors */
int tile_fits(const pd_args *a) {
    return !a->bf16 && a->R == 0 && a->Dv % 16 == 0 && a->row_of != NULL;
}

int64_t tile_rows(const pd_args *a) {
    const int64_t g = a->N / a->H, m = TILE_HEADS / (g > 0 ? g : 1);
    return m < 1 ? 1 : m > TILE_ROWS ? TILE_ROWS : m;
}

/* The keys [f, e) of tile row i within the chunk at c0 of kn keys (f >= e: none);
 * rows past the tile's (padding of the last register block) have none. */
static inline void row_keys(const pd_args *a, int64_t r0, int64_t g, int64_t M, int64_t i,
                            int64_t c0, int64_t kn, int64_t *f, int64_t *e) {
    if (i >= M) {
        *f = 0, *e = 0;
        return;
    }
    const int64_t r = r0 + i / g, hi = a->lens[r] - c0;
    *f = a->first[r] - c0;
    *e = hi < kn ? hi : kn;
}

/* Scores of RB tile rows against a chunk's KC keys (kt: the chunk's K transposed) into
 * s (row stride ld), keys outside each row's [f, e) as -inf; each row's running vector
 * maximum vmax updated. */
static inline __attribute__((always_inline)) void scores_block(
    const float *restrict qs, const float *restrict kt, int64_t D, const int64_t f[RB],
    const int64_t e[RB], float *restrict s, int64_t ld, float *restrict vmax, const int nv) {
    /* nv (1 or KV) vectors of the chunk's keys: the rest lies past every row's keys */
    v16 x[RB][KV];
    for (int r = 0; r < RB; r++)
        for (int v = 0; v < nv; v++) x[r][v] = (v16){0};
    for (int64_t d = 0; d < D; d++) {
        v16 k[KV];
        for (int v = 0; v < nv; v++) k[v] = ld16(kt + d * KC + 16 * v);
        for (int r = 0; r < RB; r++) {
            const float qd = qs[r * D + d];
            for (int v = 0; v < nv; v++) x[r][v] += qd * k[v];
        }
    }
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const v16i ninf = (v16i)((v16){0} - INFINITY);
    for (int r = 0; r < RB; r++) {
        const int whole = f[r] <= 0 && e[r] >= KC;
        v16 top = ld16(vmax + 16 * r);
        for (int v = 0; v < nv; v++) {
            if (!whole) {
                const v16i j = lane + 16 * v;
                const v16i in = (j >= (int32_t)f[r]) & (j < (int32_t)e[r]);
                x[r][v] = (v16)(((v16i)x[r][v] & in) | (ninf & ~in));
            }
            top = max16(top, x[r][v]);
            st16(s + r * ld + 16 * v, x[r][v]);
        }
        st16(vmax + 16 * r, top);
    }
}

/* acc rows (RB of them, Dv wide) = alpha * acc + p . V over the keys [j0, j1) (p: the
 * rows' probabilities, row stride ld): NV vectors of each row's values in registers at a
 * time, each value vector loaded once for the RB rows. */
static inline __attribute__((always_inline)) void values_block(
    float *restrict acc, int64_t Dv, int64_t d0, int NV, const float *restrict p, int64_t ld,
    const float alpha[RB], const float *const *vrow, int64_t j0, int64_t j1) {
    v16 x[RB][2];
    for (int r = 0; r < RB; r++)
        for (int v = 0; v < NV; v++) x[r][v] = ld16(acc + r * Dv + d0 + 16 * v) * alpha[r];
    for (int64_t j = j0; j < j1; j++) {
        const v16 v0 = ld16(vrow[j] + d0), v1 = NV > 1 ? ld16(vrow[j] + d0 + 16) : v0;
        for (int r = 0; r < RB; r++) {
            const float pj = p[r * ld + j];
            x[r][0] += pj * v0;
            if (NV > 1) x[r][1] += pj * v1;
        }
    }
    for (int r = 0; r < RB; r++)
        for (int v = 0; v < NV; v++) st16(acc + r * Dv + d0 + 16 * v, x[r][v]);
}

/* K rows [c0, c0 + KC) of the span (krow: the span's row pointers, kn of them from c0)
 * transposed into kt [D, KC]: 16 x 16 blocks in registers where D is whole vectors; past
 * the last key the lanes repeat the chunk's first (every row masks them). */
static inline void transpose_chunk(const float *const *krow, int64_t kn, int64_t D,
                                   float *restrict kt) {
    if (D % 16 == 0) {
        const float *rows[KC];
        for (int64_t j = 0; j < KC; j++) rows[j] = krow[j < kn ? j : 0];
        for (int64_t j0 = 0; j0 < KC; j0 += 16)
            for (int64_t d0 = 0; d0 < D; d0 += 16) {
                v16 x[16];
                for (int i = 0; i < 16; i++) x[i] = ld16(rows[j0 + i] + d0);
                transpose16(x);
                for (int i = 0; i < 16; i++) st16(kt + (d0 + i) * KC + j0, x[i]);
            }
        return;
    }
    for (int64_t j = 0; j < KC; j++)
        for (int64_t d = 0; d < D; d++) kt[d * KC + j] = j < kn ? krow[j][d] : 0.0f;
}

CLONES
int prefill_tile(const pd_args *a, int64_t r0, int64_t m, scratch *s) {
    const int64_t N = a->N, H = a->H, D = a->D, Dv = a->Dv, g = N / H, M = m * g;
    const int64_t Mp = (M + RB - 1) / RB * RB;  /* whole register blocks */
    const float *kc = a->k, *vc = a->v;
    /* buffers: q [Mp, D], kt [SPAN / KC, D, KC], scores [Mp, SPAN], acc [Mp, Dv],
     * mx, sm [Mp], vmax [Mp, 16], the span's K and V row pointers [2 * SPAN] */
    const size_t ptrs = (2 * SPAN * sizeof(float *) + sizeof(float) - 1) / sizeof(float);
    if (grow(&s->tile, &s->cap_tile,
             (size_t)(Mp * D + D * SPAN + Mp * SPAN + Mp * Dv + 2 * Mp + 16 * Mp) + ptrs + 16))
        return -1;
    float *restrict qs = s->tile, *restrict kt = qs + Mp * D, *restrict sc = kt + D * SPAN;
    float *restrict acc = sc + Mp * SPAN, *restrict mx = acc + Mp * Dv, *restrict sm = mx + Mp;
    float *restrict vmax = sm + Mp;
    const float **krow = (const float **)(void *)(vmax + 16 * Mp);
    const float **vrow = krow + SPAN;
    const int32_t *blocks = table_row(a, r0);
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t r = r0; r < r0 + m; r++)
        if (a->lens[r] > a->first[r]) {
            lo = a->first[r] < lo ? a->first[r] : lo;
            hi = a->lens[r] > hi ? a->lens[r] : hi;
        }
    for (int64_t h = 0; h < H; h++) {
        /* tile row i: query row r0 + i / g, head h * g + i % g */
        for (int64_t i = 0; i < Mp; i++) {
            if (i < M) {
                const float *qv = a->q + ((r0 + i / g) * N + h * g + i % g) * D;
                for (int64_t d = 0; d < D; d++) qs[i * D + d] = qv[d] * a->scale;
            } else {
                memset(qs + i * D, 0, (size_t)D * sizeof(float));
            }
            mx[i] = -INFINITY;
            sm[i] = 0.0f;
        }
        memset(acc, 0, (size_t)(Mp * Dv) * sizeof(float));
        int64_t blk_at = lo / a->bs, off = lo % a->bs;  /* walks with the keys */
        for (int64_t s0 = lo; s0 < hi; s0 += SPAN) {
            const int64_t sn = hi - s0 < SPAN ? hi - s0 : SPAN;
            for (int64_t j = 0; j < sn; j++) {
                const int64_t blk = blocks[blk_at];
                krow[j] = kc + blk * a->k_blk + off * a->k_tok + h * a->k_head;
                vrow[j] = vc + blk * a->v_blk + off * a->v_tok + h * a->v_head;
                if (++off == a->bs) off = 0, blk_at++;
            }
            for (int64_t c = 0; c < sn; c += KC)
                transpose_chunk(krow + c, sn - c < KC ? sn - c : KC, D, kt + c * D);
            for (int64_t i = 0; i < Mp; i += RB) {
                /* the block's keys in this span: [j0, j1) (whole chunks from j0's) */
                int64_t j0 = sn, j1 = 0;
                for (int r = 0; r < RB; r++) {
                    int64_t f, e;
                    row_keys(a, r0, g, M, i + r, s0, sn, &f, &e);
                    if (e > 0 && f < e) {
                        const int64_t from = f > 0 ? f : 0;
                        j0 = from < j0 ? from : j0;
                        j1 = e > j1 ? e : j1;
                    }
                }
                if (j1 == 0) continue;  /* no row of the block sees a key of this span */
                j0 = j0 / KC * KC;
                float alpha[RB], *restrict p = sc + i * SPAN, *restrict vm = vmax + 16 * i;
                /* pass 1: scores, -inf outside each row's keys */
                for (int r = 0; r < RB; r++) st16(vm + 16 * r, (v16){0} - INFINITY);
                for (int64_t c = j0; c < j1; c += KC) {
                    const int64_t kn = sn - c < KC ? sn - c : KC;
                    int64_t f[RB], e[RB];
                    for (int r = 0; r < RB; r++)
                        row_keys(a, r0, g, M, i + r, s0 + c, kn, &f[r], &e[r]);
                    /* a block's last chunk may end in its first vector (the diagonal) */
                    if (j1 - c > 16)
                        scores_block(qs + i * D, kt + c * D, D, f, e, p + c, SPAN, vm, 2);
                    else
                        scores_block(qs + i * D, kt + c * D, D, f, e, p + c, SPAN, vm, 1);
                }
                /* pass 2: each row's maximum once per span, its probabilities */
                const int64_t cend = (j1 + 15) / 16 * 16;
                const v16i ninf = (v16i)((v16){0} - INFINITY);
                for (int r = 0; r < RB; r++) {
                    const int64_t t = i + r;
                    const float mc = hmax16(ld16(vm + 16 * r));
                    float *restrict pr = p + r * SPAN;
                    if (mc == -INFINITY) {  /* no key of this span: nothing changes */
                        for (int64_t c = j0; c < cend; c += 16) st16(pr + c, (v16){0});
                        alpha[r] = 1.0f;
                        continue;
                    }
                    const float mnew = mc > mx[t] ? mc : mx[t];
                    alpha[r] = mx[t] == -INFINITY ? 0.0f : exp_nonpositive(mx[t] - mnew);
                    v16 total = {0};
                    for (int64_t c = j0; c < cend; c += 16) {
                        const v16 x = ld16(pr + c);
                        const v16 pv = (v16)((v16i)exp16(x - mnew) & ((v16i)x != ninf));
                        total += pv;
                        st16(pr + c, pv);
                    }
                    sm[t] = sm[t] * alpha[r] + hadd16(total);
                    mx[t] = mnew;
                }
                /* pass 3: values */
                int64_t d0 = 0;
                for (; d0 + 32 <= Dv; d0 += 32)
                    values_block(acc + i * Dv, Dv, d0, 2, p, SPAN, alpha, vrow, j0, j1);
                if (d0 < Dv)
                    values_block(acc + i * Dv, Dv, d0, 1, p, SPAN, alpha, vrow, j0, j1);
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
