/* A simulated graph replay's prepared launches run in one call: the program runner.
 *
 * A device replays a captured graph as one launch of its recorded tasks (CANN
 * `aclmdlRIExecuteAsync`): no host code runs between two kernels. The simulator prepares
 * each replayed kernel's launch when the op is captured or its task updated
 * (vllm_npu/ops/sim/native.py `Launch`: a task function below and its arguments packed in
 * 64-bit slots, addresses as integers, floating-point values as double bits); a replay
 * hands a run of consecutive launches to `npu_sim_run`, which calls them in order and
 * stops at the first that refuses its data (a slot past the cache, a block id outside it).
 *
 * Every task function takes its slots and returns 0, or a nonzero status the Python side
 * turns into the op's error (native.py `Launch.error`).
 */
#include <stdint.h>
#include <string.h>

#include "sim_math.h"
#include "sim_paged.h"

typedef int64_t (*task_fn)(const int64_t *a);

static inline const void *P(int64_t v) { return (const void *)(intptr_t)v; }
static inline void *W(int64_t v) { return (void *)(intptr_t)v; }

static inline double D(int64_t v) {
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

/* The kernels (sim_rows.c, sim_kernels.c). */
void npu_sim_rms_norm(const float *, const float *, const float *, float *, float *, float *,
                      int64_t, int64_t, float, int);
void npu_sim_rotary_mul(const float *, const float *, const float *, float *, const int64_t *,
                        int32_t, int);
void npu_sim_swiglu(const float *, float *, int64_t, int64_t, int);
int64_t npu_sim_scatter_rows(const char *, int64_t, const int32_t *, int64_t, char *, int64_t,
                             int64_t);
int npu_sim_linear(const float *, const float *, const float *, float *, int64_t, int64_t,
                   int64_t, int);
int npu_sim_gemm(const float *, const float *, const float *, float *, int64_t, int64_t,
                 int64_t, int, int);
int npu_sim_paged_decode_team(const pd_args *, int);
int npu_sim_paged_decode(const pd_args *, int);

/* x1, x2|0, gamma, y, rstd, xsum|0, rows, cols, eps, threads */
EXPORT int64_t npu_sim_task_rms_norm(const int64_t *a) {
    npu_sim_rms_norm(P(a[0]), P(a[1]), P(a[2]), W(a[3]), W(a[4]), W(a[5]), a[6], a[7],
                     (float)D(a[8]), (int)a[9]);
    return 0;
}

/* x, r1, r2, out, dims (int64[16]: shape, then the three inputs' strides), interleave,
 * threads */
EXPORT int64_t npu_sim_task_rotary_mul(const int64_t *a) {
    npu_sim_rotary_mul(P(a[0]), P(a[1]), P(a[2]), W(a[3]), P(a[4]), (int32_t)a[5], (int)a[6]);
    return 0;
}

/* x, out, rows, h, threads */
EXPORT int64_t npu_sim_task_swiglu(const int64_t *a) {
    npu_sim_swiglu(P(a[0]), W(a[1]), a[2], a[3], (int)a[4]);
    return 0;
}

/* src, src row stride (bytes), slots, rows, cache, row bytes, capacity: 0, or 1 + the
 * index of the first slot past the cache (nothing written) */
EXPORT int64_t npu_sim_task_scatter(const int64_t *a) {
    const int64_t r = npu_sim_scatter_rows(P(a[0]), a[1], P(a[2]), a[3], W(a[4]), a[5], a[6]);
    return r < 0 ? 0 : r + 1;
}

/* x, w, b|0, out, M, N, K, threads, kmajor: sim_gemm.c for K in whole vectors or w K-major
 * (N in whole vectors), else MKL's sgemm split by rows (sim_kernels.c); 0, or -3 without
 * GNU OpenMP / MKL (checked when the launch is prepared, native.linear_launch) */
EXPORT int64_t npu_sim_task_linear(const int64_t *a) {
    if (a[8] || a[6] % 16 == 0)
        return npu_sim_gemm(P(a[0]), P(a[1]), P(a[2]), W(a[3]), a[4], a[5], a[6], (int)a[7],
                            (int)a[8]);
    return npu_sim_linear(P(a[0]), P(a[1]), P(a[2]), W(a[3]), a[4], a[5], a[6], (int)a[7]);
}

/* pd_args, threads: 0, or npu_sim_paged_decode's -1 / -2 */
EXPORT int64_t npu_sim_task_paged_decode(const int64_t *a) {
    const pd_args *args = P(a[0]);
    if (args->B == 0) return 0;
    const int threads = (int)a[1];
    if (threads > 1) {
        const int status = npu_sim_paged_decode_team(args, threads);
        if (status != -3) return status;
    }
    return npu_sim_paged_decode(args, threads);
}

/* One element from s to d: the same bytes (es of them), or an integer widened / narrowed
 * (int32 -> int64, int64 -> int32: `to(dtype)` on token ids and positions). */
enum { COPY_SAME = 0, COPY_I32_I64 = 1, COPY_I64_I32 = 2 };

static inline void copy_one(char *d, const char *s, int64_t es, int64_t kind) {
    if (kind == COPY_I32_I64) {
        int32_t v;
        memcpy(&v, s, 4);
        const int64_t w = v;
        memcpy(d, &w, 8);
    } else if (kind == COPY_I64_I32) {
        int64_t v;
        memcpy(&v, s, 8);
        const int32_t w = (int32_t)v;
        memcpy(d, &w, 4);
    } else {
        memcpy(d, s, (size_t)es);
    }
}

/* dst, src, source element bytes, kind (COPY_*), sizes[4], src strides[4], dst strides[4]
 * (elements; fewer dims padded in front with size 1): dst = src element by element, rows
 * of contiguous same-type elements as one memcpy. */
EXPORT int64_t npu_sim_task_copy(const int64_t *a) {
    char *dst = W(a[0]);
    const char *src = P(a[1]);
    const int64_t es = a[2], kind = a[3];
    const int64_t ds = kind == COPY_I32_I64 ? 8 : kind == COPY_I64_I32 ? 4 : es;
    const int64_t *n = a + 4, *st = a + 8, *dt = a + 12;
    for (int64_t i = 0; i < n[0]; i++)
        for (int64_t j = 0; j < n[1]; j++)
            for (int64_t k = 0; k < n[2]; k++) {
                const char *s = src + (i * st[0] + j * st[1] + k * st[2]) * es;
                char *d = dst + (i * dt[0] + j * dt[1] + k * dt[2]) * ds;
                if (kind == COPY_SAME && st[3] == 1 && dt[3] == 1) {
                    memcpy(d, s, (size_t)(n[3] * es));
                    continue;
                }
                for (int64_t l = 0; l < n[3]; l++)
                    copy_one(d + l * dt[3] * ds, s + l * st[3] * es, es, kind);
            }
    return 0;
}

/* element i of an int64 (ib 8) or int32 index */
static inline int64_t index_at(const char *index, int64_t i, int64_t ib) {
    if (ib == 8) {
        int64_t k;
        memcpy(&k, index + i * 8, 8);
        return k;
    }
    int32_t k;
    memcpy(&k, index + i * 4, 4);
    return k;
}

/* out, table, index, count, row bytes, table rows, index bytes (4 or 8): out[i] =
 * table[index[i]] (`embedding`, `index_select` along dim 0); 0, or 1 + the position of the
 * first index outside [0, rows) (nothing written). */
EXPORT int64_t npu_sim_task_gather_rows(const int64_t *a) {
    char *out = W(a[0]);
    const char *table = P(a[1]), *index = P(a[2]);
    const int64_t n = a[3], row = a[4], rows = a[5], ib = a[6];
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = index_at(index, i, ib);
        if (k < 0 || k >= rows) return i + 1;
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = index_at(index, i, ib);
        memcpy(out + i * row, table + k * row, (size_t)row);
    }
    return 0;
}

/* Runs tasks 0..n-1 in order; returns n, or the index of the first task that returned a
 * nonzero status (stored in *status; the tasks after it are not run). */
EXPORT int64_t npu_sim_run(const task_fn *fns, const int64_t *const *args, int64_t n,
                           int64_t *status) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = fns[i](args[i]);
        if (s) {
            *status = s;
            return i;
        }
    }
    return n;
}
