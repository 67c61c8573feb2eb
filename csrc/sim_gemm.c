/* A graph replay's decode-sized linear: out[M, N] = x[M, K] . w[N, K]^T (+ b[N]), float32,
 * on torch's OpenMP team, for the two layouts a weight has on the simulated device.
 *
 * w as vLLM loads it (N rows of K), K a multiple of 16: dot-product form, a tile of 4 rows
 * of x by 4 rows of w is 16 accumulating vectors over K, summed across by one transposing
 * horizontal sum (sim_vec.h's hsum16), so every loaded vector feeds 2 multiply-adds.
 *
 * w K-major (the layout the device keeps its linear weights in, layers/linear.py: w^T
 * stored as K rows of N), N a multiple of 16: multiply-add form, 16 or 32 output columns of
 * MR rows of x in registers, each weight vector loaded once for the MR rows (x broadcast),
 * nothing summed across lanes: 16-27% faster than the dot form on 128-row decode batches
 * (the transposing sum costs ~3 operations per output against K / 16 multiply-adds).
 *
 * w as vLLM loads it with 32 rows of x or more (the tied LM head): the multiply-add form on
 * panels of 32 columns of w^T packed per call (16 x 16 register transposes, ~4% of the
 * panel's multiply-adds at 128 rows): 128 x 128 -> 408 167 -> 128 us on one thread.
 *
 * Threads split the output columns: each reads its part of the weights once, from L1
 * across all of x's row tiles.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sim_math.h"
#include "sim_vec.h"

int sim_team_run(void (*fn)(void *), void *arg, unsigned threads);
int sim_team_member(void);

typedef struct {
    const float *x, *w, *b;
    float *out;
    int64_t M, N, K;
    int parts;
    int form;  /* FORM_*: how the call multiplies */
} gemm_args;

/* dot products on [N, K] w; multiply-adds on K-major w (w[k * N + n]); multiply-adds on
 * panels of [N, K] w packed per call (from PACK_MIN_ROWS rows of x) */
enum { FORM_DOT, FORM_KMAJOR, FORM_PACKED };
#define FORM_UNIT(form) ((form) == FORM_DOT ? 4 : (form) == FORM_KMAJOR ? 16 : PANEL)
#define PACK_MIN_ROWS 32

/* columns [c0, c1) of every row */
CLONES
static void gemm_cols(const gemm_args *g, int64_t c0, int64_t c1) {
    const int64_t M = g->M, N = g->N, K = g->K;
    for (int64_t c = c0; c < c1; c += 4) {
        const float *wr[4];
        for (int j = 0; j < 4; j++) wr[j] = g->w + (c + j < c1 ? c + j : c1 - 1) * K;
        for (int64_t r = 0; r < M; r += 4) {
            const float *xr[4];
            for (int i = 0; i < 4; i++) xr[i] = g->x + (r + i < M ? r + i : M - 1) * K;
            v16 acc[16] = {0};
            for (int64_t k = 0; k < K; k += 16) {
                const v16 w0 = ld16(wr[0] + k), w1 = ld16(wr[1] + k), w2 = ld16(wr[2] + k),
                          w3 = ld16(wr[3] + k);
                for (int i = 0; i < 4; i++) {
                    const v16 xv = ld16(xr[i] + k);
                    acc[REV[i * 4 + 0]] += xv * w0;
                    acc[REV[i * 4 + 1]] += xv * w1;
                    acc[REV[i * 4 + 2]] += xv * w2;
                    acc[REV[i * 4 + 3]] += xv * w3;
                }
            }
            float s[16];
            st16(s, hsum16(acc));
            for (int i = 0; i < 4 && r + i < M; i++)
                for (int j = 0; j < 4 && c + j < c1; j++)
                    g->out[(r + i) * N + c + j] = s[i * 4 + j] + (g->b ? g->b[c + j] : 0.0f);
        }
    }
}

#define MR 8      /* rows of x per register block of the multiply-add form */
#define PANEL 32  /* output columns per packed panel of an [N, K] weight */

/* Columns [c, c + nc) of every row (nc <= 16 * NV) from wt, element (k, j) at
 * wt[k * ldw + j] for the block's columns j (a K-major weight, or a packed panel). */
static inline __attribute__((always_inline)) void madd_block(const gemm_args *g,
                                                             const float *wt, int64_t ldw,
                                                             int64_t c, int64_t nc,
                                                             const int NV) {
    const int64_t M = g->M, N = g->N, K = g->K;
    for (int64_t r = 0; r < M; r += MR) {
        const float *xr[MR];
        for (int i = 0; i < MR; i++) xr[i] = g->x + (r + i < M ? r + i : M - 1) * K;
        v16 acc[MR][2];
        for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = (v16){0};
        for (int64_t k = 0; k < K; k++) {
            const float *wk = wt + k * ldw;
            const v16 w0 = ld16(wk), w1 = NV > 1 ? ld16(wk + 16) : w0;
            for (int i = 0; i < MR; i++) {
                const float xk = xr[i][k];
                acc[i][0] += xk * w0;
                if (NV > 1) acc[i][1] += xk * w1;
            }
        }
        for (int i = 0; i < MR && r + i < M; i++) {
            float *o = g->out + (r + i) * N + c;
            if (nc == 16 * NV) {
                for (int v = 0; v < NV; v++)
                    st16(o + 16 * v, acc[i][v] + (g->b ? ld16(g->b + c + 16 * v) : (v16){0}));
                continue;
            }
            float row[32] = {0};  /* a last panel's columns */
            for (int v = 0; v < NV; v++) st16(row + 16 * v, acc[i][v]);
            for (int64_t j = 0; j < nc; j++) o[j] = row[j] + (g->b ? g->b[c + j] : 0.0f);
        }
    }
}

/* K-major w: columns [c0, c1), both multiples of 16 */
CLONES
static void kmajor_cols(const gemm_args *g, int64_t c0, int64_t c1) {
    int64_t c = c0;
    for (; c + 32 <= c1; c += 32) madd_block(g, g->w + c, g->N, c, 32, 2);
    if (c < c1) madd_block(g, g->w + c, g->N, c, 16, 1);
}

/* [N, K] w, K a multiple of 16: columns [c0, c1) a panel of PANEL at a time, w^T packed
 * into `panel` ([K, PANEL], zeros past column N) by 16 x 16 register transposes, then
 * multiplied like a K-major weight; the packing costs ~4% of the panel's multiply-adds
 * at 128 rows (used from PACK_MIN_ROWS rows, below which the dot products win). */
CLONES
static void packed_cols(const gemm_args *g, int64_t c0, int64_t c1, float *panel) {
    const int64_t K = g->K;
    for (int64_t c = c0; c < c1; c += PANEL) {
        const int64_t nc = c1 - c < PANEL ? c1 - c : PANEL;
        for (int64_t j0 = 0; j0 < PANEL; j0 += 16)
            for (int64_t k0 = 0; k0 < K; k0 += 16) {
                v16 t[16];
                for (int i = 0; i < 16; i++)
                    t[i] = j0 + i < nc ? ld16(g->w + (c + j0 + i) * K + k0) : (v16){0};
                transpose16(t);
                for (int i = 0; i < 16; i++) st16(panel + (k0 + i) * PANEL + j0, t[i]);
            }
        if (nc > 16)
            madd_block(g, panel, PANEL, c, nc, 2);
        else
            madd_block(g, panel, PANEL, c, nc, 1);
    }
}

/* columns [c0, c1) in the call's form */
static void run_cols(const gemm_args *g, int64_t c0, int64_t c1) {
    if (g->form == FORM_KMAJOR) {
        kmajor_cols(g, c0, c1);
        return;
    }
    float *panel = g->form == FORM_PACKED ? malloc((size_t)g->K * PANEL * sizeof(float)) : NULL;
    if (panel) {
        packed_cols(g, c0, c1, panel);
        free(panel);
    } else {
        gemm_cols(g, c0, c1);  /* the dot products (also where no panel could be had) */
    }
}

static void gemm_member(void *arg) {
    const gemm_args *g = arg;
    const int64_t part = sim_team_member();
    if (part >= g->parts) return;
    /* whole tiles of `unit` columns per part */
    const int64_t unit = FORM_UNIT(g->form), tiles = (g->N + unit - 1) / unit;
    const int64_t c0 = tiles * part / g->parts * unit;
    int64_t c1 = tiles * (part + 1) / g->parts * unit;
    run_cols(g, c0, c1 < g->N ? c1 : g->N);
}

/* w [N, K] (`kmajor` 0) or K-major (1): 0, or -3 (nothing written) without GNU OpenMP,
 * for K (N when K-major) not a multiple of 16 */
EXPORT int npu_sim_gemm(const float *x, const float *w, const float *b, float *out, int64_t M,
                        int64_t N, int64_t K, int threads, int kmajor) {
    if ((kmajor ? N : K) % 16 || M <= 0 || N <= 0) return -3;
    const int form = kmajor ? FORM_KMAJOR : M >= PACK_MIN_ROWS ? FORM_PACKED : FORM_DOT;
    gemm_args g = {x, w, b, out, M, N, K, threads < 1 ? 1 : threads, form};
    const int64_t units = (N + FORM_UNIT(form) - 1) / FORM_UNIT(form);
    if (g.parts > units) g.parts = (int)units;
    if (g.parts == 1) {
        run_cols(&g, 0, N);
        return 0;
    }
    return sim_team_run(gemm_member, &g, (unsigned)g.parts);
}
