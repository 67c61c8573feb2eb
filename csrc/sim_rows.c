/* The simulated NPU's native row kernels: RMSNorm (with the residual add), rotary
 * multiply, SwiGLU and the KV cache scatter, float32 (the scatter copies bytes of any
 * dtype).
 *
 * Same formulas as the PyTorch code they replace in vllm_npu/ops/sim (norm.py, rotary.py,
 * activation.py, cache.py), one pass over memory instead of several aten ops: a decode
 * step runs them on a few hundred KB right after the attention kernel has streamed
 * megabytes of K/V through the caches, where each aten op's fixed cost doubled
 * (docs/performance.md). The rules
 * the device enforces stay in the Python ops, in front of these calls.
 *
 * Rounding: rotary is bitwise the PyTorch formula (products rounded, then added: no fused
 * multiply-add, see the pragma); RMSNorm sums squares in another order than torch's
 * reduction, SwiGLU's exp is sim_math.h's polynomial: within a few ulp of torch.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sim_math.h"

/* x * c + y * s must round each product, as the two aten multiplies and the add do */
#pragma GCC optimize("fp-contract=off")

int sim_team_run(void (*fn)(void *), void *arg, unsigned threads);
int sim_team_member(void);

/* Work of at least this many floats is split over the device's cores (an eager prefill's
 * rows: a decode step's few hundred KB stay on one, where a team costs more than it saves) */
#define TEAM_MIN_ELEMENTS (1 << 16)

typedef struct {
    void (*part)(const void *op, int64_t r0, int64_t r1);
    const void *op;
    int64_t rows, parts;
} row_split;

static void split_member(void *arg) {
    const row_split *s = arg;
    const int64_t me = sim_team_member();
    if (me < s->parts) s->part(s->op, s->rows * me / s->parts, s->rows * (me + 1) / s->parts);
}

/* part(op, r0, r1) over rows [0, rows): in equal runs on `threads` of torch's OpenMP team
 * when there are `elements` enough, else (or without GNU OpenMP) on this thread */
static void over_rows(void (*part)(const void *, int64_t, int64_t), const void *op,
                      int64_t rows, int64_t elements, int threads) {
    row_split s = {part, op, rows, threads < rows ? threads : rows};
    if (s.parts > 1 && elements >= TEAM_MIN_ELEMENTS &&
        sim_team_run(split_member, &s, (unsigned)s.parts) == 0)
        return;
    part(op, 0, rows);
}

typedef struct {
    const float *x1, *x2, *gamma;
    float *y, *rstd, *xsum;
    int64_t cols;
    float eps;
} rms_op;

CLONES
static void rms_rows(const void *arg, int64_t r0, int64_t r1) {
    const rms_op *o = arg;
    const float *x1 = o->x1, *x2 = o->x2, *gamma = o->gamma;
    float *y = o->y, *rstd = o->rstd, *xsum = o->xsum;
    const int64_t cols = o->cols;
    const float eps = o->eps;
    for (int64_t r = r0; r < r1; r++) {
        const float *a = x1 + r * cols;
        const float *row = a;
        if (x2) {
            const float *b = x2 + r * cols;
            float *s = xsum + r * cols;
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) s[j] = a[j] + b[j];
            row = s;
        }
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < cols; j++) ss += row[j] * row[j];
        const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        rstd[r] = inv;
        float *out = y + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) out[j] = gamma[j] * (row[j] * inv);
    }
}

/* rows x cols, contiguous. x = x1 + x2 (x2 may be NULL), written to xsum when given;
 * rstd[r] = 1 / sqrt(mean(x[r]^2) + eps); y = gamma * (x * rstd) (HF's RMSNorm order). */
EXPORT void npu_sim_rms_norm(const float *x1, const float *x2, const float *gamma, float *y,
                             float *rstd, float *xsum, int64_t rows, int64_t cols, float eps,
                             int threads) {
    const rms_op o = {x1, x2, gamma, y, rstd, xsum, cols, eps};
    over_rows(rms_rows, &o, rows, rows * cols, threads);
}

typedef struct {
    const float *x, *r1, *r2;
    float *out;
    const int64_t *dims;
    int32_t interleave;
} rotary_op;

/* rows [n0, n1) of the shape's first three dims, flattened */
CLONES
static void rotary_rows(const void *arg, int64_t n0, int64_t n1) {
    const rotary_op *op = arg;
    const int64_t *shape = op->dims, *xs = op->dims + 4, *c_s = op->dims + 8,
                  *s_s = op->dims + 12;
    const int64_t D = shape[3], h = D / 2;
    int64_t i2 = n0 % shape[2], i1 = n0 / shape[2] % shape[1], i0 = n0 / shape[2] / shape[1];
    for (int64_t n = n0; n < n1; n++) {
        const float *xv = op->x + i0 * xs[0] + i1 * xs[1] + i2 * xs[2];
        const float *c = op->r1 + i0 * c_s[0] + i1 * c_s[1] + i2 * c_s[2];
        const float *s = op->r2 + i0 * s_s[0] + i1 * s_s[1] + i2 * s_s[2];
        float *o = op->out + n * D;
        if (!op->interleave) {
#pragma omp simd
            for (int64_t d = 0; d < h; d++) o[d] = xv[d] * c[d] + (-xv[d + h]) * s[d];
#pragma omp simd
            for (int64_t d = h; d < D; d++) o[d] = xv[d] * c[d] + xv[d - h] * s[d];
        } else {
            for (int64_t d = 0; d < D; d += 2) {
                o[d] = xv[d] * c[d] + (-xv[d + 1]) * s[d];
                o[d + 1] = xv[d + 1] * c[d + 1] + xv[d] * s[d + 1];
            }
        }
        if (++i2 == shape[2]) {  /* the next row's index by counting: no divisions */
            i2 = 0;
            if (++i1 == shape[1]) i1 = 0, i0++;
        }
    }
}

/* out[i] = x[i] * r1[i] + rot(x)[i] * r2[i] over a 4-D shape; rot: "half" (NeoX)
 * cat(-x[D/2:], x[:D/2]), or "interleave" (GPT-J) pairs (x0, x1) -> (-x1, x0).
 * dims: the shape, then the strides of x, r1 and r2 in elements (0 where r1/r2
 * broadcast), 4 each; the last dim of x, r1, r2 contiguous; out contiguous. */
EXPORT void npu_sim_rotary_mul(const float *x, const float *r1, const float *r2, float *out,
                               const int64_t *dims, int32_t interleave, int threads) {
    const rotary_op op = {x, r1, r2, out, dims, interleave};
    const int64_t rows = dims[0] * dims[1] * dims[2];
    over_rows(rotary_rows, &op, rows, rows * dims[3], threads);
}

typedef struct {
    const float *x;
    float *out;
    int64_t h;
} swiglu_op;

CLONES
static void swiglu_rows(const void *arg, int64_t r0, int64_t r1) {
    const swiglu_op *op = arg;
    const int64_t h = op->h;
    for (int64_t r = r0; r < r1; r++) {
        const float *a = op->x + r * 2 * h, *b = a + h;
        float *o = op->out + r * h;
#pragma omp simd
        for (int64_t j = 0; j < h; j++) {
            const float e = exp_nonpositive(-fabsf(a[j]));
            /* one division: a / (1 + e) or (a e) / (1 + e), the two roundings as before */
            const float silu = (a[j] >= 0.0f ? a[j] : a[j] * e) / (1.0f + e);
            o[j] = silu * b[j];
        }
    }
}

/* rows x 2h, contiguous: out[r, j] = silu(x[r, j]) * x[r, h + j] (SwiGLU along the last
 * dim), silu(a) = a / (1 + e^-a) as torch computes it for a >= 0, a e^a / (1 + e^a)
 * below (exp of a non-positive argument only). */
EXPORT void npu_sim_swiglu(const float *x, float *out, int64_t rows, int64_t h, int threads) {
    const swiglu_op op = {x, out, h};
    over_rows(swiglu_rows, &op, rows, rows * 2 * h, threads);
}

/* dst row slots[t] = src row t (row_bytes each; src rows src_stride bytes apart) for the
 * n tokens; a negative slot (padding) is skipped. Every slot is checked before anything
 * is written: returns -1, or the index of the first slot >= capacity (nothing written). */
EXPORT int64_t npu_sim_scatter_rows(const char *src, int64_t src_stride, const int32_t *slots,
                                    int64_t n, char *dst, int64_t row_bytes,
                                    int64_t capacity) {
    for (int64_t t = 0; t < n; t++)
        if (slots[t] >= capacity) return t;
    for (int64_t t = 0; t < n; t++)
        if (slots[t] >= 0)
            memcpy(dst + (int64_t)slots[t] * row_bytes, src + t * src_stride,
                   (size_t)row_bytes);
    return -1;
}
