/* The simulated NPU's native kernels: attention of query rows over a paged KV cache.
 *
 * What the device's paged-attention kernels compute (ATB PagedAttentionOperation,
 * npu_fused_infer_attention_score over a paged cache, MLA decode): for query row r and
 * query head n, softmax(scale * q . K[first_r : len_r]) . V over the keys of its KV head
 * n / (N / H) in block-table row row_of[r] (r for decode rows), read where they lie in the
 * table's blocks, never gathered into a padded copy. float32 arithmetic (bf16 caches
 * widened on load); writes out [B, N, Dv] float32 and, when asked, lse [B, N] (-inf and a
 * zero row for a row with no key). Decode rows of float32 caches run in one pass
 * (sim_decode.c), the others (bf16, rope, head dims not in vectors of 16) in two here
 * (one_request); runs of prefill rows of one request as tiles (sim_prefill.c).
 *
 * Also a graph replay's linear, rows split over the same team (npu_sim_linear, at the end).
 *
 * Called through ctypes (vllm_npu/ops/sim/paged_decode.py); plain C11, no Python API. Work is
 * split by request (tile) over torch's OpenMP team (npu_sim_paged_decode_team) or, without
 * GNU OpenMP, a small pool of threads that sleep on a condition variable between calls
 * (no spinning: the host thread of the engine shares these cores).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_math.h"
#include "sim_paged.h"
#include "sim_vec.h"

/* ---- arithmetic ------------------------------------------------------------------- */

/* [sum(p[0]), ..., sum(p[7])]: three rounds of pairwise interleave-and-add. */
static inline v8 hsum8x8(const v8 p[8]) {
    const v8i even = {0, 8, 2, 10, 4, 12, 6, 14}, odd = {1, 9, 3, 11, 5, 13, 7, 15};
    const v8i lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8i lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    v8 s[4], t[2];
    for (int i = 0; i < 4; i++)
        s[i] = __builtin_shuffle(p[2 * i], p[2 * i + 1], even) +
               __builtin_shuffle(p[2 * i], p[2 * i + 1], odd);
    for (int i = 0; i < 2; i++)
        t[i] = __builtin_shuffle(s[2 * i], s[2 * i + 1], lo2) +
               __builtin_shuffle(s[2 * i], s[2 * i + 1], hi2);
    return __builtin_shuffle(t[0], t[1], lo4) + __builtin_shuffle(t[0], t[1], hi4);
}

/* q . rows[i] for 8 rows of W floats (W a multiple of 8) */
static inline v8 dots8(const float *q, const float *const rows[8], int64_t W) {
    v8 p[8] = {0};
    for (int64_t d = 0; d < W; d += 8) {
        const v8 qd = load8(q + d);
        for (int i = 0; i < 8; i++) p[i] += qd * load8(rows[i] + d);
    }
    return hsum8x8(p);
}

static inline void widen(float *dst, const void *src, int64_t n, int bf16) {
    if (!bf16) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)s[i] << 16;  /* bf16 is the top half of a float32 */
        memcpy(dst + i, &bits, sizeof bits);
    }
}

/* 0, or -2 when request b's keys reach past its table row or into a block id outside
 * [0, num_blocks): refused before any read (the callers check the device's rules first;
 * this keeps a slip from reading outside the cache). */
static int check_blocks(const pd_args *a, int64_t b) {
    const int64_t lo = a->first[b], hi = a->lens[b];
    if (hi <= lo) return 0;
    if (lo < 0 || (hi - 1) / a->bs >= a->table_stride) return -2;
    const int32_t *blocks = table_row(a, b);
    for (int64_t c = lo / a->bs; c <= (hi - 1) / a->bs; c++)
        if (blocks[c] < 0 || blocks[c] >= a->num_blocks) return -2;
    return 0;
}

static inline int64_t padded(int64_t n) { return (n + 7) & ~(int64_t)7; }

/* Key rows read in place: float32 caches whose head dim is a multiple of 8, no rope. */
static inline int keys_in_place(const pd_args *a) {
    return !a->bf16 && a->R == 0 && a->D % 8 == 0;
}

/* Block id and offset of tokens t0 .. t0 + 7 of a request (positions lo + t), found once
 * per group of eight (a 64-bit division per token and head cost more than the dots);
 * tokens past the request's m valid ones repeat the last. */
static inline void token_slots(const pd_args *a, const int32_t *blocks, int64_t pos,
                               int64_t m, int64_t blk[8], int64_t off[8]) {
    int64_t c = pos / a->bs, o = pos % a->bs;
    for (int i = 0; i < 8; i++) {
        if (i >= m) {
            blk[i] = blk[m - 1];
            off[i] = off[m - 1];
            continue;
        }
        blk[i] = blocks[c];
        off[i] = o;
        if (++o == a->bs) o = 0, c++;
    }
}

CLONES
static void one_request(const pd_args *a, int64_t b, scratch *s) {
    const int64_t N = a->N, H = a->H, D = a->D, R = a->R, Dv = a->Dv, g = N / H;
    const int64_t W = keys_in_place(a) ? D : padded(D) + padded(R);
    const int64_t lo = a->first[b], hi = a->lens[b], n = hi - lo;
    float *out = a->out + b * N * Dv;
    if (n <= 0) {
        memset(out, 0, (size_t)(N * Dv) * sizeof(float));
        if (a->lse)
            for (int64_t i = 0; i < N; i++) a->lse[b * N + i] = -INFINITY;
        return;
    }
    if (decode_fits(a)) {
        decode_row(a, b, s);
        return;
    }
    const size_t esz = a->bf16 ? 2 : 4;
    const int32_t *blocks = table_row(a, b);
    float *sc = s->scores, *acc = s->acc, *qs = s->q;

    /* the queries, scaled, as [N, W] rows laid out like the widened key rows */
    memset(qs, 0, (size_t)(N * W) * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        const float *qv = a->q + (b * N + i) * D, *qr = a->q_rope + (b * N + i) * R;
        for (int64_t d = 0; d < D; d++) qs[i * W + d] = qv[d] * a->scale;
        for (int64_t d = 0; d < R; d++) qs[i * W + padded(D) + d] = qr[d] * a->scale;
    }
    /* scores[n, t] = q_n . k_t (+ q_rope_n . k_rope_t), eight keys at a time, every
     * head of a token row before the next rows (each cache line fetched once) */
    for (int64_t t0 = 0; t0 < n; t0 += 8) {
        const int64_t m = n - t0 < 8 ? n - t0 : 8;
        int64_t tb[8], to[8];  /* past the end: a repeat */
        token_slots(a, blocks, lo + t0, m, tb, to);
        for (int64_t h = 0; h < H; h++) {
            const float *rows[8];
            for (int i = 0; i < 8; i++) {
                const int64_t blk = tb[i], off = to[i];
                const char *k = (const char *)a->k +
                    (size_t)(blk * a->k_blk + off * a->k_tok + h * a->k_head) * esz;
                if (keys_in_place(a)) {
                    rows[i] = (const float *)k;
                    continue;
                }
                float *row = s->rows + i * W;
                memset(row, 0, (size_t)W * sizeof(float));
                widen(row, k, D, a->bf16);
                if (R)
                    widen(row + padded(D), (const char *)a->k_rope +
                          (size_t)(blk * a->kr_blk + off * a->kr_tok + h * a->kr_head) * esz,
                          R, a->bf16);
                rows[i] = row;
            }
            for (int64_t j = 0; j < g; j++) {
                const int64_t qn = h * g + j;
                const v8 r = dots8(qs + qn * W, rows, W);
                for (int64_t i = 0; i < m; i++) sc[qn * n + t0 + i] = r[i];
            }
        }
    }
    /* softmax numerators in place; their sums normalise at the end */
    float sums[N];
    for (int64_t i = 0; i < N; i++) {
        float *srow = sc + i * n, m = srow[0], total = 0.0f;
#pragma omp simd reduction(max : m)
        for (int64_t t = 1; t < n; t++) m = srow[t] > m ? srow[t] : m;
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < n; t++) {
            srow[t] = exp_nonpositive(srow[t] - m);
            total += srow[t];
        }
        sums[i] = total;
        if (a->lse) a->lse[b * N + i] = m + logf(total);
    }
    /* acc[n] = sum_t p[n, t] v_t, eight values per pass over acc (one read-modify-write
     * of acc per eight keys) */
    memset(acc, 0, (size_t)(N * Dv) * sizeof(float));
    for (int64_t t0 = 0; t0 < n; t0 += 8) {
        const int64_t m = n - t0 < 8 ? n - t0 : 8;
        int64_t tb[8], to[8];  /* past the end: a repeat, weight 0 */
        token_slots(a, blocks, lo + t0, m, tb, to);
        for (int64_t h = 0; h < H; h++) {
            const float *v[8];
            for (int i = 0; i < 8; i++) {
                const char *src = (const char *)a->v +
                    (size_t)(tb[i] * a->v_blk + to[i] * a->v_tok + h * a->v_head) * esz;
                v[i] = (const float *)src;
                if (a->bf16) {
                    widen(s->rows + i * Dv, src, Dv, 1);
                    v[i] = s->rows + i * Dv;
                }
            }
            for (int64_t j = 0; j < g; j++) {
                const int64_t qn = h * g + j;
                float p[8];
                for (int i = 0; i < 8; i++) p[i] = i < m ? sc[qn * n + t0 + i] : 0.0f;
                float *ar = acc + qn * Dv;
                for (int64_t d = 0; d < Dv; d++)
                    ar[d] += p[0] * v[0][d] + p[1] * v[1][d] + p[2] * v[2][d] +
                             p[3] * v[3][d] + p[4] * v[4][d] + p[5] * v[5][d] +
                             p[6] * v[6][d] + p[7] * v[7][d];
            }
        }
    }
    for (int64_t i = 0; i < N; i++) {
        const float inv = 1.0f / sums[i];
        for (int64_t d = 0; d < Dv; d++) out[i * Dv + d] = acc[i * Dv + d] * inv;
    }
}

/* ---- the thread pool ----------------------------------------------------------------
 * Helpers sleep on a condition variable. A call opens a round, works through the requests
 * itself, then closes the round and waits only for the helpers that joined it: a helper
 * the OS has not run yet (both cores busy) never holds the call up, it finds the round
 * closed and goes back to sleep. */

#define MAX_THREADS 64
/* below this many multiply-adds (~0.1 ms on one core) a call runs on the caller alone */
#define WORK_PER_THREAD (1 << 21)

static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int started;           /* helper threads running */
    pid_t owner;           /* the process that started them (a fork child has none) */
    uint64_t round;        /* bumped per call */
    int open;              /* the current round still takes helpers */
    int wanted;            /* helpers 1..wanted may join it */
    int active;            /* helpers inside it */
    const pd_args *args;
    int64_t next;          /* next request to claim (atomically) */
    int failed;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

static scratch scratches[MAX_THREADS];

static int prepare(scratch *s, const pd_args *a) {
    int64_t longest = 1;
    for (int64_t b = 0; b < a->B; b++)
        if (a->lens[b] - a->first[b] > longest) longest = a->lens[b] - a->first[b];
    const int64_t W = padded(a->D) + padded(a->R);
    const int64_t rows = 8 * (W > a->Dv ? W : a->Dv);
    /* decode rows keep scores in whole vectors of 16 (sim_decode.c) */
    return grow(&s->scores, &s->cap_scores, (size_t)(a->N * ((longest + 15) / 16 * 16))) |
           grow(&s->q, &s->cap_q, (size_t)(a->N * W)) |
           grow(&s->rows, &s->cap_rows, (size_t)rows) |
           grow(&s->acc, &s->cap_acc, (size_t)(a->N * a->Dv));
}

/* The call's work items: with `row_of`, runs of up to tile_rows() consecutive rows of one
 * request (item i: rows [tiles.start[i], tiles.start[i + 1])); otherwise each row alone
 * (tiles.n == 0). Planned by the caller before the helpers start. */
static struct {
    int64_t *start;
    size_t cap;
    int64_t n;
} tiles;

static int plan_tiles(const pd_args *a) {
    tiles.n = 0;
    if (!tile_fits(a)) return 0;
    if (tiles.cap < (size_t)a->B + 1) {
        int64_t *p = realloc(tiles.start, ((size_t)a->B + 1) * sizeof *p);
        if (!p) return -1;
        tiles.start = p;
        tiles.cap = (size_t)a->B + 1;
    }
    const int64_t per = tile_rows(a);
    for (int64_t r = 0; r < a->B;) {
        int64_t e = r + 1;
        while (e < a->B && e - r < per && a->row_of[e] == a->row_of[r]) e++;
        tiles.start[tiles.n++] = r;
        r = e;
    }
    tiles.start[tiles.n] = a->B;
    return 0;
}

static void run_item(const pd_args *a, int64_t item, scratch *s) {
    const int64_t r0 = tiles.n ? tiles.start[item] : item;
    const int64_t m = tiles.n ? tiles.start[item + 1] - r0 : 1;
    for (int64_t r = r0; r < r0 + m; r++)
        if (check_blocks(a, r)) {
            __atomic_store_n(&pool.failed, -2, __ATOMIC_RELAXED);
            return;
        }
    if (m > 1) {
        if (prefill_tile(a, r0, m, s)) __atomic_store_n(&pool.failed, -1, __ATOMIC_RELAXED);
        return;
    }
    one_request(a, r0, s);
}

static void drain(const pd_args *a, scratch *s) {
    if (prepare(s, a)) {
        __atomic_store_n(&pool.failed, -1, __ATOMIC_RELAXED);
        return;
    }
    const int64_t items = tiles.n ? tiles.n : a->B;
    /* claimed one ahead, so that a decode row can prefetch the next one's first keys */
    int64_t item = __atomic_fetch_add(&pool.next, 1, __ATOMIC_RELAXED);
    while (item < items) {
        const int64_t next = __atomic_fetch_add(&pool.next, 1, __ATOMIC_RELAXED);
        s->next = tiles.n || next >= items ? -1 : next;
        run_item(a, item, s);
        item = next;
    }
}

static void *helper(void *arg) {
    const int me = (int)(intptr_t)arg;  /* 1.. ; the caller is 0 */
    uint64_t seen = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.round == seen)
            pthread_cond_wait(&pool.work, &pool.mu);
        seen = pool.round;
        if (!pool.open || me > pool.wanted) continue;
        pool.active++;
        const pd_args *a = pool.args;
        pthread_mutex_unlock(&pool.mu);
        drain(a, &scratches[me]);
        pthread_mutex_lock(&pool.mu);
        if (--pool.active == 0) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

static pthread_mutex_t one_call = PTHREAD_MUTEX_INITIALIZER;

static int threads_for(const pd_args *a, int threads) {
    int64_t keys = 0;
    for (int64_t b = 0; b < a->B; b++)
        keys += a->lens[b] > a->first[b] ? a->lens[b] - a->first[b] : 0;
    const int64_t work = keys * a->N * (a->D + a->R + a->Dv);
    const int64_t useful = 1 + work / WORK_PER_THREAD;
    if (threads > useful) threads = (int)useful;
    if (threads > a->B) threads = (int)a->B;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    return threads < 1 ? 1 : threads;
}

/* Opens a call (serialised: one pool, one set of scratch buffers): its work items
 * planned, the thread count fitted to its work. -1 (call not opened) without memory. */
static int open_call(const pd_args *a, int *threads) {
    pthread_mutex_lock(&one_call);
    if (plan_tiles(a)) {
        pthread_mutex_unlock(&one_call);
        return -1;
    }
    *threads = threads_for(a, *threads);
    pool.next = 0;
    pool.failed = 0;
    return 0;
}

/* ---- torch's OpenMP team ------------------------------------------------------------
 * Eager forwards and a replay's matmuls compute with the device's cores through torch's
 * OpenMP runtime, whose idle workers spin for a while after every parallel op: a helper of
 * our own pool would share a core with a spinning worker (an attention call measured
 * 19 -> 23 ms right after a matmul). Calls run on torch's team instead: the runtime torch
 * loaded (found by soname, never loaded here), entered through libgomp's `GOMP_parallel`,
 * the entry GCC compiles `#pragma omp parallel` to. Without it (another runtime), our
 * pool. */

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
static gomp_parallel_fn gomp_parallel;
static int (*gomp_thread_num)(void);
static pthread_once_t gomp_once = PTHREAD_ONCE_INIT;

/* `name` in the library `soname` if the process has loaded it (never loaded here), else
 * NULL. */
static void *loaded_symbol(const char *soname, const char *name) {
    void *lib = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    return lib ? dlsym(lib, name) : NULL;
}

static void find_gomp(void) {
    gomp_thread_num = (int (*)(void))loaded_symbol("libgomp.so.1", "omp_get_thread_num");
    if (gomp_thread_num)
        gomp_parallel = (gomp_parallel_fn)loaded_symbol("libgomp.so.1", "GOMP_parallel");
}

static void team_member(void *arg) { drain(arg, &scratches[gomp_thread_num()]); }

/* fn(arg) on `threads` members of torch's OpenMP team (sim_gemm.c): 0, or -3 without GNU
 * OpenMP (nothing run). */
__attribute__((visibility("hidden"))) int sim_team_run(void (*fn)(void *), void *arg,
                                                       unsigned threads) {
    pthread_once(&gomp_once, find_gomp);
    if (!gomp_parallel) return -3;
    gomp_parallel(fn, arg, threads, 0);
    return 0;
}

__attribute__((visibility("hidden"))) int sim_team_member(void) { return gomp_thread_num(); }

/* Runs the call on torch's OpenMP team: 0 / -1 / -2 as npu_sim_paged_decode, or -3 when
 * no GNU OpenMP runtime is loaded (the caller then uses npu_sim_paged_decode). */
EXPORT int npu_sim_paged_decode_team(const pd_args *a, int threads) {
    pthread_once(&gomp_once, find_gomp);
    if (!gomp_parallel) return -3;
    if (open_call(a, &threads)) return -1;
    gomp_parallel(team_member, (void *)a, (unsigned)threads, 0);
    const int failed = pool.failed;
    pthread_mutex_unlock(&one_call);
    return failed;
}

/* Returns 0; -1 when scratch memory could not be allocated; -2 when a request's keys
 * fall outside its table row or the cache (`check_blocks`). */
EXPORT int npu_sim_paged_decode(const pd_args *a, int threads) {
    if (open_call(a, &threads)) return -1;
    pthread_mutex_lock(&pool.mu);
    if (pool.owner != getpid()) {  /* first call, or a forked child: no helpers yet */
        pool.started = 0;
        pool.owner = getpid();
    }
    while (pool.started < threads - 1) {
        pthread_t id;
        if (pthread_create(&id, NULL, helper, (void *)(intptr_t)(pool.started + 1)))
            break;  /* fewer threads, same result */
        pthread_detach(id);
        pool.started++;
    }
    pool.args = a;
    pool.wanted = threads - 1;
    pool.open = 1;
    pool.round++;
    if (threads > 1) pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.mu);

    drain(a, &scratches[0]);

    pthread_mutex_lock(&pool.mu);
    pool.open = 0;
    while (pool.active > 0) pthread_cond_wait(&pool.done, &pool.mu);
    const int failed = pool.failed;
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&one_call);
    return failed;
}

/* ---- linear on torch's OpenMP team ------------------------------------------------------
 * out[M, N] = x[M, K] . w[N, K]^T (+ b[N]): a graph replay's linears, whose 128-row products
 * MKL's own threading splits poorly. Rows are split into one part per thread, each
 * computed by the `sgemm_` torch calls for a float32 linear (MKL, inside the libtorch_cpu
 * torch loaded; found by soname, never loaded here) on one MKL thread, the bias first
 * copied into the output rows and added by the product (beta = 1), as torch's addmm does. */

typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *,
                         const float *, const float *, const int *, const float *,
                         const int *, const float *, float *, const int *);
static sgemm_fn sgemm;
static int (*mkl_threads_local)(int);
static pthread_once_t sgemm_once = PTHREAD_ONCE_INIT;

static void find_sgemm(void) {
    mkl_threads_local = (int (*)(int))loaded_symbol("libtorch_cpu.so",
                                                    "MKL_Set_Num_Threads_Local");
    if (mkl_threads_local) sgemm = (sgemm_fn)loaded_symbol("libtorch_cpu.so", "sgemm_");
}

#define LINEAR_MIN_ROWS 16

typedef struct {
    const float *x, *w, *b;
    float *out;
    int M, N, K, parts;
    int next;  /* next part to claim (atomically) */
} lin_args;

static void linear_rows(const lin_args *l, int part) {
    const int r0 = (int)((int64_t)l->M * part / l->parts);
    const int rows = (int)((int64_t)l->M * (part + 1) / l->parts) - r0;  /* >= 16 */
    float *out = l->out + (int64_t)r0 * l->N;
    const float one = 1.0f, beta = l->b ? 1.0f : 0.0f;
    if (l->b)
        for (int r = 0; r < rows; r++)
            memcpy(out + (int64_t)r * l->N, l->b, sizeof(float) * (size_t)l->N);
    /* column-major: out^T[N, rows] = (w as K x N)^T . (x rows as K x rows) */
    sgemm("T", "N", &l->N, &rows, &l->K, &one, l->w, &l->K, l->x + (int64_t)r0 * l->K, &l->K,
          &beta, out, &l->N);
}

static void linear_member(void *arg) {
    lin_args *l = arg;
    const int before = mkl_threads_local(1);
    for (int part; (part = __atomic_fetch_add(&l->next, 1, __ATOMIC_RELAXED)) < l->parts;)
        linear_rows(l, part);
    mkl_threads_local(before);
}

/* 0, or -3 when torch's GNU OpenMP runtime or MKL's sgemm_ is not there (the caller then
 * runs torch's linear). x, w, out contiguous float32; b NULL or N floats. */
EXPORT int npu_sim_linear(const float *x, const float *w, const float *b, float *out,
                          int64_t M, int64_t N, int64_t K, int threads) {
    pthread_once(&gomp_once, find_gomp);
    pthread_once(&sgemm_once, find_sgemm);
    if (!gomp_parallel || !sgemm || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return -3;
    /* parts of at least LINEAR_MIN_ROWS rows: MKL takes other paths for a few rows */
    const int64_t most = M / LINEAR_MIN_ROWS;
    lin_args l = {x, w, b, out, (int)M, (int)N, (int)K, threads, 0};
    if (l.parts > most) l.parts = (int)most;
    if (l.parts < 1) l.parts = 1;
    gomp_parallel(linear_member, &l, (unsigned)l.parts, 0);
    return 0;
}
