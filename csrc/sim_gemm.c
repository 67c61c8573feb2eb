/* A graph replay's decode-sized linear: out[M, N] = x[M, K] . w[N, K]^T (+ b[N]), float32,
 * on torch's OpenMP team, for the two layouts a weight has on the simulated device.
 *
 * w as vLLM loads it (N rows of K), K a multiple of 16: dot-product form, a tile of 4 rows
 * of x by 4 rows of w is 16 accumulating vectors over K, summed across by one transposing
 * horizontal sum (sim_vec.h's hsum16), so every loaded vector feeds 2 multiply-adds.
 *
 * w K-major (the layout the device keeps its linear weights in, ops/layers/linear.py: w^T
 * stored as K rows of N), N a multiple of 16: multiply-add form, 16 or 32 output columns of
 * MR rows of x in registers, each weight vector loaded once for the MR rows (x broadcast),
 * nothing summed across lanes: 16-27% faster than the dot form on 128-row decode batches
 * (the transposing sum costs ~3 operations per output against K / 16 multiply-adds).
 *
 * Threads split the output columns: each reads its part of the weights once, from L1
 * across all of x's row tiles.
 */
#include <stdint.h>
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
    int kmajor;  /* w stored K-major: w[k * N + n] */
} gemm_args;

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

#define MR 8  /* rows of x per register block of the multiply-add form */

/* K-major w (row stride N): columns [c, c + 16 * NV) of every row */
static inline __attribute__((always_inline)) void kmajor_block(const gemm_args *g, int64_t c,
                                                               const int NV) {
    const int64_t M = g->M, N = g->N, K = g->K;
    for (int64_t r = 0; r < M; r += MR) {
        const float *xr[MR];
        for (int i = 0; i < MR; i++) xr[i] = g->x + (r + i < M ? r + i : M - 1) * K;
        v16 acc[MR][2];
        for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = (v16){0};
        for (int64_t k = 0; k < K; k++) {
            const float *wk = g->w + k * N + c;
            const v16 w0 = ld16(wk), w1 = NV > 1 ? ld16(wk + 16) : w0;
            for (int i = 0; i < MR; i++) {
                const float xk = xr[i][k];
                acc[i][0] += xk * w0;
                if (NV > 1) acc[i][1] += xk * w1;
            }
        }
        for (int i = 0; i < MR && r + i < M; i++)
            for (int v = 0; v < NV; v++) {
                const v16 bias = g->b ? ld16(g->b + c + 16 * v) : (v16){0};
                st16(g->out + (r + i) * N + c + 16 * v, acc[i][v] + bias);
            }
    }
}

/* K-major w: columns [c0, c1), both multiples of 16 */
CLONES
static void kmajor_cols(const gemm_args *g, int64_t c0, int64_t c1) {
    int64_t c = c0;
    for (; c + 32 <= c1; c += 32) kmajor_block(g, c, 2);
    if (c < c1) kmajor_block(g, c, 1);
}

static void gemm_member(void *arg) {
    const gemm_args *g = arg;
    const int64_t part = sim_team_member();
    if (part >= g->parts) return;
    /* whole tiles of `unit` columns per part */
    const int64_t unit = g->kmajor ? 16 : 4, tiles = (g->N + unit - 1) / unit;
    const int64_t c0 = tiles * part / g->parts * unit;
    int64_t c1 = tiles * (part + 1) / g->parts * unit;
    c1 = c1 < g->N ? c1 : g->N;
    if (g->kmajor)
        kmajor_cols(g, c0, c1);
    else
        gemm_cols(g, c0, c1);
}

/* w [N, K] (`kmajor` 0) or K-major (1): 0, or -3 (nothing written) without GNU OpenMP,
 * for K (N when K-major) not a multiple of 16 */
EXPORT int npu_sim_gemm(const float *x, const float *w, const float *b, float *out, int64_t M,
                        int64_t N, int64_t K, int threads, int kmajor) {
    if ((kmajor ? N : K) % 16 || M <= 0 || N <= 0) return -3;
    gemm_args g = {x, w, b, out, M, N, K, threads < 1 ? 1 : threads, kmajor};
    const int64_t units = kmajor ? N / 16 : (N + 3) / 4;
    if (g.parts > units) g.parts = (int)units;
    if (g.parts == 1) {
        if (kmajor)
            kmajor_cols(&g, 0, N);
        else
            gemm_cols(&g, 0, N);
        return 0;
    }
    return sim_team_run(gemm_member, &g, (unsigned)g.parts);
}
