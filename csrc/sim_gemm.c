/* A graph replay's decode-sized linear: out[M, N] = x[M, K] . w[N, K]^T (+ b[N]), float32,
 * K a multiple of 16, on torch's OpenMP team.
 *
 * Dot-product form on the weights as they lie (no packed copy to keep in step with them):
 * a tile of 4 rows of x by 4 rows of w is 16 accumulating vectors over K, summed across by
 * one transposing horizontal sum (sim_vec.h's hsum16), so every loaded vector feeds 2
 * multiply-adds. Threads split w's rows (the output columns): each reads its part of the
 * weights once, from L1 across all of x's row tiles.
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

static void gemm_member(void *arg) {
    const gemm_args *g = arg;
    const int64_t part = sim_team_member();
    if (part >= g->parts) return;
    /* whole tiles of 4 columns per part */
    const int64_t tiles = (g->N + 3) / 4;
    const int64_t c0 = tiles * part / g->parts * 4, c1 = tiles * (part + 1) / g->parts * 4;
    gemm_cols(g, c0, c1 < g->N ? c1 : g->N);
}

/* 0, or -3 (nothing written) without GNU OpenMP or for K not a multiple of 16 */
EXPORT int npu_sim_gemm(const float *x, const float *w, const float *b, float *out, int64_t M,
                        int64_t N, int64_t K, int threads) {
    if (K % 16 || M <= 0 || N <= 0) return -3;
    gemm_args g = {x, w, b, out, M, N, K, threads < 1 ? 1 : threads};
    if (g.parts > (N + 3) / 4) g.parts = (int)((N + 3) / 4);
    if (g.parts == 1) {
        gemm_cols(&g, 0, N);
        return 0;
    }
    return sim_team_run(gemm_member, &g, (unsigned)g.parts);
}
