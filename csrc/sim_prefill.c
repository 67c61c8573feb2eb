/* The simulated NPU's prefill attention: a tile of consecutive query rows of one request
 * against its keys, read in place from the paged cache (npu_fused_infer_attention_score's
 * TND rows of more than one token: prefill, chunked prefill, prefix-cache hits).
 *
 * Same result as the per-row kernel (sim_kernels.c one_request), computed the way a
 * flash-attention kernel does: keys in chunks of KC, each chunk's K transposed once and
 * its scores for every row of the tile (m rows x g query heads of one KV head) formed as
 * a small matrix product; softmax online (running maximum and sum, rescaled per chunk).
 * Rows go in register blocks of RB: each loaded K^T / V vector feeds RB rows' multiply-adds
 * (scores_block, values_block), each row's softmax on whole vectors (exp16, masks only on
 * a chunk the row sees in part). Against the row-at-a-time version (scalar softmax, V
 * reloaded per row): 16 x 512 causal 33 -> 18 ms, 64 x 128 13.5 -> 8-10 ms (one thread).
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
#define TILE_ROWS 16
#define RB 4           /* tile rows per register block (8 measured the same) */

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

/* Scores of RB tile rows against the chunk's KC keys (kt: the chunk's K transposed),
 * softmax'd online: the rows' probabilities into p (exactly 0 outside each row's keys),
 * each row's running maximum and sum updated, its rescale factor into alpha. */
static inline __attribute__((always_inline)) void scores_block(
    const float *restrict qs, const float *restrict kt, int64_t D, const int64_t f[RB],
    const int64_t e[RB], float *restrict p, float *restrict mx, float *restrict sm,
    float alpha[RB]) {
    v16 s[RB][KV];
    for (int r = 0; r < RB; r++)
        for (int v = 0; v < KV; v++) s[r][v] = (v16){0};
    for (int64_t d = 0; d < D; d++) {
        v16 k[KV];
        for (int v = 0; v < KV; v++) k[v] = ld16(kt + d * KC + 16 * v);
        for (int r = 0; r < RB; r++) {
            const float qd = qs[r * D + d];
            for (int v = 0; v < KV; v++) s[r][v] += qd * k[v];
        }
    }
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const v16i ninf = (v16i)((v16){0} - INFINITY);
    for (int r = 0; r < RB; r++) {
        float *restrict pr = p + r * KC;
        if (e[r] <= 0 || f[r] >= e[r]) {  /* no key of this chunk: nothing changes */
            for (int v = 0; v < KV; v++) st16(pr + 16 * v, (v16){0});
            alpha[r] = 1.0f;
            continue;
        }
        v16i in[KV];
        const int whole = f[r] <= 0 && e[r] >= KC;
        v16 top = (v16){0} - INFINITY;
        for (int v = 0; v < KV; v++) {
            in[v] = ~(v16i){0};  /* every lane */
            if (!whole) {
                const v16i j = lane + 16 * v;
                in[v] = (j >= (int32_t)f[r]) & (j < (int32_t)e[r]);
                s[r][v] = (v16)(((v16i)s[r][v] & in[v]) | (ninf & ~in[v]));
            }
            top = max16(top, s[r][v]);
        }
        const float mc = hmax16(top), mnew = mc > mx[r] ? mc : mx[r];
        alpha[r] = mx[r] == -INFINITY ? 0.0f : exp_nonpositive(mx[r] - mnew);
        v16 total = {0};
        for (int v = 0; v < KV; v++) {
            v16 pv = exp16(s[r][v] - mnew);
            if (!whole) pv = (v16)((v16i)pv & in[v]);
            total += pv;
            st16(pr + 16 * v, pv);
        }
        sm[r] = sm[r] * alpha[r] + hadd16(total);
        mx[r] = mnew;
    }
}

/* acc rows (RB of them, Dv wide) = alpha * acc + p . V over the chunk's keys [j0, j1):
 * NV vectors of each row's values in registers at a time, each value vector loaded once
 * for the RB rows. */
static inline __attribute__((always_inline)) void values_block(
    float *restrict acc, int64_t Dv, int64_t d0, int NV, const float *restrict p,
    const float alpha[RB], const float *const vrow[KC], int64_t j0, int64_t j1) {
    v16 x[RB][2];
    for (int r = 0; r < RB; r++)
        for (int v = 0; v < NV; v++) x[r][v] = ld16(acc + r * Dv + d0 + 16 * v) * alpha[r];
    for (int64_t j = j0; j < j1; j++) {
        const v16 v0 = ld16(vrow[j] + d0), v1 = NV > 1 ? ld16(vrow[j] + d0 + 16) : v0;
        for (int r = 0; r < RB; r++) {
            const float pj = p[r * KC + j];
            x[r][0] += pj * v0;
            if (NV > 1) x[r][1] += pj * v1;
        }
    }
    for (int r = 0; r < RB; r++)
        for (int v = 0; v < NV; v++) st16(acc + r * Dv + d0 + 16 * v, x[r][v]);
}

CLONES
int prefill_tile(const pd_args *a, int64_t r0, int64_t m, scratch *s) {
    const int64_t N = a->N, H = a->H, D = a->D, Dv = a->Dv, g = N / H, M = m * g;
    const int64_t Mp = (M + RB - 1) / RB * RB;  /* whole register blocks */
    const float *kc = a->k, *vc = a->v;
    /* buffers: q [Mp, D], kt [D, KC], p [Mp, KC], acc [Mp, Dv], mx [Mp], sm [Mp] */
    if (grow(&s->tile, &s->cap_tile, (size_t)(Mp * D + D * KC + Mp * KC + Mp * Dv + 2 * Mp)))
        return -1;
    float *restrict qs = s->tile, *restrict kt = qs + Mp * D, *restrict sc = kt + D * KC;
    float *restrict acc = sc + Mp * KC, *restrict mx = acc + Mp * Dv, *restrict sm = mx + Mp;
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
        for (int64_t c0 = lo; c0 < hi; c0 += KC) {
            const int64_t kn = hi - c0 < KC ? hi - c0 : KC;
            const float *vrow[KC], *krow[KC];
            for (int64_t j = 0; j < kn; j++) {
                const int64_t blk = blocks[blk_at];
                krow[j] = kc + blk * a->k_blk + off * a->k_tok + h * a->k_head;
                vrow[j] = vc + blk * a->v_blk + off * a->v_tok + h * a->v_head;
                if (++off == a->bs) off = 0, blk_at++;
            }
            if (D % 16 == 0) {
                /* 16 x 16 blocks transposed in registers; past the chunk's last key the
                 * lanes repeat its first (every row masks them) */
                for (int64_t j = kn; j < KC; j++) krow[j] = krow[0];
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
            for (int64_t i = 0; i < Mp; i += RB) {
                int64_t f[RB], e[RB], j0 = KC, j1 = 0;
                for (int r = 0; r < RB; r++) {
                    row_keys(a, r0, g, M, i + r, c0, kn, &f[r], &e[r]);
                    if (e[r] > 0 && f[r] < e[r]) {
                        const int64_t from = f[r] > 0 ? f[r] : 0;
                        j0 = from < j0 ? from : j0;
                        j1 = e[r] > j1 ? e[r] : j1;
                    }
                }
                if (j1 == 0) continue;  /* no row of the block sees a key of this chunk */
                float alpha[RB];
                scores_block(qs + i * D, kt, D, f, e, sc + i * KC, mx + i, sm + i, alpha);
                int64_t d0 = 0;
                for (; d0 + 32 <= Dv; d0 += 32)
                    values_block(acc + i * Dv, Dv, d0, 2, sc + i * KC, alpha, vrow, j0, j1);
                if (d0 < Dv)
                    values_block(acc + i * Dv, Dv, d0, 1, sc + i * KC, alpha, vrow, j0, j1);
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
