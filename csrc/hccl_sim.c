/*
 * hccl_sim.c: a CPU simulator of HCCL for the processes of one host.
 *
 * Design
 *   - HcclGetRootInfo writes a magic, a unique POSIX shm name and the staging-buffer size
 *     into the 4108-byte root info.  Every rank of HcclCommInitRootInfo opens (creating if
 *     needed) that segment, registers its pid, and waits (bounded) until all nRanks have
 *     attached.  The rank that completes the group unlinks the name at once: from then on
 *     the kernel frees the memory when the last member unmaps it or exits, however it exits.
 *   - The segment = a header (per-rank barrier counters, p2p channel counters, a wake-up
 *     word) + a staging area of fixed size (HCCL_SIM_BUFFER_MB, default 16 MiB, carried in
 *     the root info).  Each rank owns buffer/nRanks bytes of it: two "halves" used
 *     alternately by the collectives and one p2p area (a segment per destination).
 *     Collectives move data in chunks of at most one half, so memory does not grow with the
 *     message size.
 *   - Synchronisation: C11 atomics on the shared header.  A rank waiting spins briefly, then
 *     sleeps on a futex (the shared "bell" word, rung by every state change).  Every wait has
 *     a deadline (HCCL_SIM_TIMEOUT_S, default 60 s): a peer that died or never arrives gives
 *     HCCL_E_TIMEOUT, and the failing rank marks the communicator aborted in shared memory so
 *     that the other ranks fail fast instead of waiting out their own timeouts.
 *   - Reductions of fp16/bf16 accumulate in float over the ranks in rank order and round
 *     once (round to nearest even); integers wrap like C unsigned arithmetic.  Each element
 *     is reduced by exactly one rank, so all ranks get bit-identical results.
 *
 * Build: setup.py (pip install / make install): gcc -O2 -shared -fPIC -pthread, -lrt
 */
#define _GNU_SOURCE
#include "hccl_sim.h"
#include "hccl_sim_hosts.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SIM_MAX_RANKS 64
#define SIM_MAGIC "HCCLSIM1"
#define SIM_VERSION 2u
#define SIM_COMM_MAGIC 0x48434353494d434fULL
#define SIM_DEFAULT_BUFFER_MB 16
#define SIM_DEFAULT_TIMEOUT_S 60.0
#define SIM_SPIN 4000
#define SIM_NAME_MAX 64

/* ------------------------------------------------------------------------------------ */
/* shared layout                                                                         */

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t reserved;
    uint64_t buffer_bytes;
    char shm_name[SIM_NAME_MAX];
    sim_host_t host; /* the root rank's host and HCCL address (hccl_sim_hosts.c) */
} sim_root_t;

_Static_assert(sizeof(sim_root_t) <= HCCL_ROOT_INFO_BYTES, "root info payload too large");

typedef struct {
    _Atomic uint32_t barrier_seq; /* barriers this rank has entered */
    _Atomic int32_t pid;          /* 0 until the rank attached */
    char pad[56];
} sim_rank_t;

typedef struct {
    _Atomic uint32_t sent;  /* chunks the sender has written */
    _Atomic uint32_t acked; /* chunks the receiver has consumed */
    _Atomic uint64_t len;   /* bytes in the current chunk */
} sim_chan_t;

typedef struct {
    _Atomic uint32_t nranks;    /* 0 until the first rank attaches */
    _Atomic uint32_t nattached;
    _Atomic uint32_t aborted;   /* 0, or 1 + the rank that gave up */
    char pad0[52];
    _Atomic uint32_t bell;      /* futex word: bumped on every state change */
    _Atomic uint32_t nwaiters;  /* ranks sleeping (or about to) on bell */
    char pad1[56];
    _Atomic uint64_t scratch[2][SIM_MAX_RANKS]; /* small per-op values, alternating */
    sim_rank_t ranks[SIM_MAX_RANKS];
    sim_chan_t chan[SIM_MAX_RANKS][SIM_MAX_RANKS]; /* [src][dst] */
} sim_hdr_t;

#define SIM_HDR_BYTES ((sizeof(sim_hdr_t) + 4095) & ~(size_t)4095)

typedef struct {
    uint64_t magic;
    sim_hdr_t *hdr;
    char *data;
    size_t map_bytes;
    uint32_t rank, nranks;
    uint32_t bseq;      /* barriers entered by this rank */
    uint32_t half;      /* which half the next collective chunk uses */
    uint32_t sseq;      /* which scratch array the next alltoallv uses */
    size_t share;       /* bytes of the staging area owned by each rank */
    size_t half_bytes;  /* bytes of one collective half */
    size_t p2p_bytes;   /* bytes of one p2p channel segment */
    double timeout_s;
    int broken;
    char name[SIM_NAME_MAX];
} sim_comm_t;

/* ------------------------------------------------------------------------------------ */
/* errors                                                                                */

static __thread char g_last_error[512];

static HcclResult fail(HcclResult code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof(g_last_error), fmt, ap);
    va_end(ap);
    return code;
}

const char *HcclSimGetLastError(void) { return g_last_error; }

const char *HcclGetErrorString(HcclResult code)
{
    switch (code) {
    case HCCL_SUCCESS: return "success";
    case HCCL_E_PARA: return "parameter error";
    case HCCL_E_PTR: return "empty pointer";
    case HCCL_E_MEMORY: return "memory error";
    case HCCL_E_INTERNAL: return "internal error";
    case HCCL_E_NOT_SUPPORT: return "feature not supported";
    case HCCL_E_NOT_FOUND: return "resource not found";
    case HCCL_E_UNAVAIL: return "resource unavailable";
    case HCCL_E_SYSCALL: return "system call failed";
    case HCCL_E_TIMEOUT: return "timeout";
    case HCCL_E_OPEN_FILE_FAILURE: return "failed to open file";
    case HCCL_E_TCP_CONNECT: return "tcp connect failed";
    case HCCL_E_ROCE_CONNECT: return "roce connect failed";
    case HCCL_E_TCP_TRANSFER: return "tcp transfer failed";
    case HCCL_E_ROCE_TRANSFER: return "roce transfer failed";
    case HCCL_E_RUNTIME: return "runtime api failed";
    case HCCL_E_DRV: return "driver api failed";
    case HCCL_E_PROFILING: return "profiling api failed";
    case HCCL_E_CCE: return "cce api failed";
    case HCCL_E_NETWORK: return "network api failed";
    case HCCL_E_AGAIN: return "try again";
    case HCCL_E_REMOTE: return "remote error (error cqe)";
    case HCCL_E_SUSPENDING: return "communicator suspending";
    default: return "unknown HcclResult";
    }
}

/* ------------------------------------------------------------------------------------ */
/* helpers                                                                               */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A positive number from the environment, else dflt (a bad value is reported, not fatal). */
static double env_positive(const char *name, double dflt)
{
    const char *raw = getenv(name);
    if (raw == NULL || *raw == '\0')
        return dflt;
    char *end = NULL;
    double v = strtod(raw, &end);
    if (end == raw || *end != '\0' || !(v > 0.0)) {
        fprintf(stderr, "hccl_sim: ignoring %s=%s (want a number > 0); using %g\n", name, raw,
                dflt);
        return dflt;
    }
    return v;
}

static size_t dtype_size(HcclDataType dt)
{
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: case HCCL_DATA_TYPE_UINT8: return 1;
    case HCCL_DATA_TYPE_INT16: case HCCL_DATA_TYPE_UINT16:
    case HCCL_DATA_TYPE_FP16: case HCCL_DATA_TYPE_BFP16: return 2;
    case HCCL_DATA_TYPE_INT32: case HCCL_DATA_TYPE_UINT32: case HCCL_DATA_TYPE_FP32: return 4;
    case HCCL_DATA_TYPE_INT64: case HCCL_DATA_TYPE_UINT64: case HCCL_DATA_TYPE_FP64: return 8;
    case HCCL_DATA_TYPE_INT128: return 16;
    default: return 0;
    }
}

static void ring(sim_hdr_t *h)
{
    atomic_fetch_add(&h->bell, 1);
    if (atomic_load(&h->nwaiters) > 0)
        syscall(SYS_futex, &h->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* A predicate: -1 when the wait is over, else the rank still awaited. */
typedef int (*pending_fn)(const sim_comm_t *c, const void *arg);

static HcclResult wait_for(sim_comm_t *c, pending_fn pending, const void *arg, const char *what)
{
    sim_hdr_t *h = c->hdr;
    int miss = pending(c, arg);
    if (miss < 0)
        return HCCL_SUCCESS;
    for (int i = 0; i < SIM_SPIN; i++) {
        cpu_relax();
        if ((i & 255) == 255)
            sched_yield();
        if ((miss = pending(c, arg)) < 0)
            return HCCL_SUCCESS;
    }
    const double deadline = now_s() + c->timeout_s;
    for (;;) {
        uint32_t ab = atomic_load(&h->aborted);
        if (ab != 0) {
            c->broken = 1;
            return fail(HCCL_E_TIMEOUT,
                        "%s: rank %u: communicator aborted because rank %u timed out", what,
                        c->rank, ab - 1);
        }
        atomic_fetch_add(&h->nwaiters, 1);
        uint32_t bell = atomic_load(&h->bell);
        miss = pending(c, arg);
        if (miss < 0) {
            atomic_fetch_sub(&h->nwaiters, 1);
            return HCCL_SUCCESS;
        }
        double left = deadline - now_s();
        if (left <= 0.0) {
            atomic_fetch_sub(&h->nwaiters, 1);
            uint32_t expect = 0;
            atomic_compare_exchange_strong(&h->aborted, &expect, c->rank + 1);
            ring(h);
            c->broken = 1;
            return fail(HCCL_E_TIMEOUT,
                        "%s: rank %u timed out after %.3g s (HCCL_SIM_TIMEOUT_S) waiting for "
                        "rank %d (dead, or never called the matching operation)",
                        what, c->rank, c->timeout_s, miss);
        }
        if (left > 0.2)
            left = 0.2; /* re-check the abort flag and the clock now and then */
        struct timespec ts;
        ts.tv_sec = (time_t)left;
        ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
        syscall(SYS_futex, &h->bell, FUTEX_WAIT, bell, &ts, NULL, 0);
        atomic_fetch_sub(&h->nwaiters, 1);
    }
}

static int pending_attach(const sim_comm_t *c, const void *arg)
{
    (void)arg;
    for (uint32_t r = 0; r < c->nranks; r++)
        if (atomic_load(&c->hdr->ranks[r].pid) == 0)
            return (int)r;
    return -1;
}

static int pending_barrier(const sim_comm_t *c, const void *arg)
{
    uint32_t target = *(const uint32_t *)arg;
    for (uint32_t r = 0; r < c->nranks; r++) {
        uint32_t seq = atomic_load_explicit(&c->hdr->ranks[r].barrier_seq, memory_order_acquire);
        if ((int32_t)(seq - target) < 0)
            return (int)r;
    }
    return -1;
}

static HcclResult barrier(sim_comm_t *c, const char *what)
{
    uint32_t target = ++c->bseq;
    atomic_store_explicit(&c->hdr->ranks[c->rank].barrier_seq, target, memory_order_seq_cst);
    ring(c->hdr);
    return wait_for(c, pending_barrier, &target, what);
}

static inline char *slot(const sim_comm_t *c, uint32_t r, uint32_t half)
{
    return c->data + (size_t)r * c->share + (size_t)half * c->half_bytes;
}

static inline char *p2p_seg(const sim_comm_t *c, uint32_t src, uint32_t dst)
{
    return c->data + (size_t)src * c->share + 2 * c->half_bytes + (size_t)dst * c->p2p_bytes;
}

static inline uint32_t next_half(sim_comm_t *c)
{
    uint32_t h = c->half;
    c->half ^= 1u;
    return h;
}

static HcclResult check_comm(HcclComm comm, const char *what, sim_comm_t **out)
{
    sim_comm_t *c = (sim_comm_t *)comm;
    if (c == NULL)
        return fail(HCCL_E_PTR, "%s: comm is NULL", what);
    if (c->magic != SIM_COMM_MAGIC)
        return fail(HCCL_E_PARA, "%s: comm is not a live simulator communicator", what);
    if (c->broken)
        return fail(HCCL_E_UNAVAIL, "%s: rank %u: communicator unusable after an earlier error",
                    what, c->rank);
    *out = c;
    return HCCL_SUCCESS;
}

/* ------------------------------------------------------------------------------------ */
/* element conversions                                                                   */

static inline float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bf16_load(uint16_t b) { return bits_to_f32((uint32_t)b << 16); }

static inline uint16_t bf16_store(float f)
{
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

static inline float fp16_load(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)man * 5.9604644775390625e-8f; /* man * 2^-24: zero or subnormal */
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_to_f32(sign | 0x7f800000u | (man << 13));
    return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t fp16_store(float f)
{
    uint32_t u = f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u;          /* NaN */
    if (a >= 0x477ff000u)
        return sign | 0x7c00u;          /* >= 65520 rounds to infinity */
    if (a < 0x38800000u) {              /* below 2^-14: subnormal half (or zero) */
        float scaled = bits_to_f32(a) * 16777216.0f;           /* exact: times 2^24 */
        float rounded = (scaled + 8388608.0f) - 8388608.0f;    /* ties to even integer */
        return sign | (uint16_t)rounded;                       /* 0x400 = smallest normal */
    }
    a += 0xfffu + ((a >> 13) & 1u);
    a -= 112u << 23;
    return sign | (uint16_t)(a >> 13);
}

/* ------------------------------------------------------------------------------------ */
/* reduction kernels: dst[i] = src[0][i] op src[1][i] op ... (rank order)                */

#define RBLK 1024

#define FLOAT_KERNEL(NAME, T, ACC, LOAD, STORE)                                               \
    static void NAME(void *dst, const void *const *src, int n, size_t cnt, HcclReduceOp op)   \
    {                                                                                          \
        ACC acc[RBLK];                                                                         \
        for (size_t b = 0; b < cnt; b += RBLK) {                                               \
            size_t m = cnt - b < RBLK ? cnt - b : RBLK;                                        \
            const T *s0 = (const T *)src[0] + b;                                               \
            for (size_t i = 0; i < m; i++)                                                     \
                acc[i] = LOAD(s0[i]);                                                          \
            for (int j = 1; j < n; j++) {                                                      \
                const T *s = (const T *)src[j] + b;                                            \
                switch (op) {                                                                  \
                case HCCL_REDUCE_SUM:                                                          \
                    for (size_t i = 0; i < m; i++) acc[i] += LOAD(s[i]);                       \
                    break;                                                                     \
                case HCCL_REDUCE_PROD:                                                         \
                    for (size_t i = 0; i < m; i++) acc[i] *= LOAD(s[i]);                       \
                    break;                                                                     \
                case HCCL_REDUCE_MAX:                                                          \
                    for (size_t i = 0; i < m; i++) {                                           \
                        ACC v = LOAD(s[i]);                                                    \
                        acc[i] = acc[i] < v ? v : acc[i];                                      \
                    }                                                                          \
                    break;                                                                     \
                default:                                                                       \
                    for (size_t i = 0; i < m; i++) {                                           \
                        ACC v = LOAD(s[i]);                                                    \
                        acc[i] = v < acc[i] ? v : acc[i];                                      \
                    }                                                                          \
                    break;                                                                     \
                }                                                                              \
            }                                                                                  \
            T *d = (T *)dst + b;                                                               \
            for (size_t i = 0; i < m; i++)                                                     \
                d[i] = STORE(acc[i]);                                                          \
        }                                                                                      \
    }

#define SAME(x) (x)
FLOAT_KERNEL(reduce_f32, float, float, SAME, SAME)
FLOAT_KERNEL(reduce_f64, double, double, SAME, SAME)
FLOAT_KERNEL(reduce_bf16, uint16_t, float, bf16_load, bf16_store)
FLOAT_KERNEL(reduce_f16, uint16_t, float, fp16_load, fp16_store)

/* Integers: sum and product in the unsigned type U (wrap-around, no UB). */
#define INT_KERNEL(NAME, T, U)                                                                 \
    static void NAME(void *dst, const void *const *src, int n, size_t cnt, HcclReduceOp op)   \
    {                                                                                          \
        T acc[RBLK];                                                                           \
        for (size_t b = 0; b < cnt; b += RBLK) {                                               \
            size_t m = cnt - b < RBLK ? cnt - b : RBLK;                                        \
            memcpy(acc, (const T *)src[0] + b, m * sizeof(T));                                 \
            for (int j = 1; j < n; j++) {                                                      \
                const T *s = (const T *)src[j] + b;                                            \
                switch (op) {                                                                  \
                case HCCL_REDUCE_SUM:                                                          \
                    for (size_t i = 0; i < m; i++) acc[i] = (T)((U)acc[i] + (U)s[i]);          \
                    break;                                                                     \
                case HCCL_REDUCE_PROD:                                                         \
                    for (size_t i = 0; i < m; i++) acc[i] = (T)((U)acc[i] * (U)s[i]);          \
                    break;                                                                     \
                case HCCL_REDUCE_MAX:                                                          \
                    for (size_t i = 0; i < m; i++) acc[i] = acc[i] < s[i] ? s[i] : acc[i];     \
                    break;                                                                     \
                default:                                                                       \
                    for (size_t i = 0; i < m; i++) acc[i] = s[i] < acc[i] ? s[i] : acc[i];     \
                    break;                                                                     \
                }                                                                              \
            }                                                                                  \
            memcpy((T *)dst + b, acc, m * sizeof(T));                                          \
        }                                                                                      \
    }

/* unsigned int is used for 8/16-bit types so that the product does not overflow an int */
INT_KERNEL(reduce_i8, int8_t, unsigned int)
INT_KERNEL(reduce_u8, uint8_t, unsigned int)
INT_KERNEL(reduce_i16, int16_t, unsigned int)
INT_KERNEL(reduce_u16, uint16_t, unsigned int)
INT_KERNEL(reduce_i32, int32_t, uint32_t)
INT_KERNEL(reduce_u32, uint32_t, uint32_t)
INT_KERNEL(reduce_i64, int64_t, uint64_t)
INT_KERNEL(reduce_u64, uint64_t, uint64_t)

typedef void (*reduce_fn)(void *, const void *const *, int, size_t, HcclReduceOp);

static reduce_fn reducer(HcclDataType dt)
{
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: return reduce_i8;
    case HCCL_DATA_TYPE_UINT8: return reduce_u8;
    case HCCL_DATA_TYPE_INT16: return reduce_i16;
    case HCCL_DATA_TYPE_UINT16: return reduce_u16;
    case HCCL_DATA_TYPE_INT32: return reduce_i32;
    case HCCL_DATA_TYPE_UINT32: return reduce_u32;
    case HCCL_DATA_TYPE_INT64: return reduce_i64;
    case HCCL_DATA_TYPE_UINT64: return reduce_u64;
    case HCCL_DATA_TYPE_FP16: return reduce_f16;
    case HCCL_DATA_TYPE_FP32: return reduce_f32;
    case HCCL_DATA_TYPE_FP64: return reduce_f64;
    case HCCL_DATA_TYPE_BFP16: return reduce_bf16;
    default: return NULL;
    }
}

/* ------------------------------------------------------------------------------------ */
/* setup and teardown                                                                    */

HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo)
{
    static _Atomic uint32_t counter;
    if (rootInfo == NULL)
        return fail(HCCL_E_PTR, "HcclGetRootInfo: rootInfo is NULL");
    double mb = env_positive("HCCL_SIM_BUFFER_MB", SIM_DEFAULT_BUFFER_MB);
    if (mb < 1.0)
        mb = 1.0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint32_t salt = (uint32_t)ts.tv_nsec ^ ((uint32_t)ts.tv_sec << 7) ^ (uint32_t)(uintptr_t)&ts;
    sim_root_t root;
    memset(&root, 0, sizeof(root));
    memcpy(root.magic, SIM_MAGIC, 8);
    root.version = SIM_VERSION;
    root.buffer_bytes = (uint64_t)(mb * 1048576.0) & ~(uint64_t)4095;
    snprintf(root.shm_name, sizeof(root.shm_name), "/hccl_sim_%d_%u_%08x", (int)getpid(),
             atomic_fetch_add(&counter, 1), salt);
    char err[256];
    if (sim_host_listen(&root.host, root.shm_name, err, sizeof(err)) != 0)
        return fail(HCCL_E_TCP_CONNECT, "HcclGetRootInfo: %s", err);
    memset(rootInfo, 0, sizeof(*rootInfo));
    memcpy(rootInfo->internal, &root, sizeof(root));
    return HCCL_SUCCESS;
}

HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                HcclComm *comm)
{
    const char *what = "HcclCommInitRootInfo";
    if (rootInfo == NULL || comm == NULL)
        return fail(HCCL_E_PTR, "%s: rank %u: rootInfo or comm is NULL", what, rank);
    *comm = NULL;
    if (nRanks == 0 || nRanks > SIM_MAX_RANKS)
        return fail(HCCL_E_PARA, "%s: rank %u: nRanks=%u out of range 1..%d", what, rank, nRanks,
                    SIM_MAX_RANKS);
    if (rank >= nRanks)
        return fail(HCCL_E_PARA, "%s: rank %u is not below nRanks=%u", what, rank, nRanks);
    sim_root_t root;
    memcpy(&root, rootInfo->internal, sizeof(root));
    if (memcmp(root.magic, SIM_MAGIC, 8) != 0 || root.version != SIM_VERSION ||
        memchr(root.shm_name, '\0', sizeof(root.shm_name)) == NULL || root.shm_name[0] != '/')
        return fail(HCCL_E_PARA, "%s: rank %u: root info was not made by this simulator's "
                    "HcclGetRootInfo", what, rank);
    if (root.buffer_bytes / nRanks < 16384)
        return fail(HCCL_E_PARA, "%s: rank %u: staging buffer of %llu bytes too small for %u "
                    "ranks (raise HCCL_SIM_BUFFER_MB)", what, rank,
                    (unsigned long long)root.buffer_bytes, nRanks);

    double timeout_s = env_positive("HCCL_SIM_TIMEOUT_S", SIM_DEFAULT_TIMEOUT_S);
    char err[256];
    HcclResult reach = sim_host_check(&root.host, rank, timeout_s, err, sizeof(err));
    if (reach != HCCL_SUCCESS)
        return fail(reach, "%s: %s", what, err);

    sim_comm_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return fail(HCCL_E_MEMORY, "%s: rank %u: out of memory", what, rank);
    c->rank = rank;
    c->nranks = nRanks;
    c->timeout_s = timeout_s;
    memcpy(c->name, root.shm_name, SIM_NAME_MAX);
    c->map_bytes = SIM_HDR_BYTES + root.buffer_bytes;

    int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
    if (fd < 0) {
        int e = errno;
        free(c);
        return fail(HCCL_E_SYSCALL, "%s: rank %u: shm_open(%s) failed: %s", what, rank,
                    root.shm_name, strerror(e));
    }
    /* Every rank sets the same size, so a late ftruncate never shrinks a mapped object. */
    if (ftruncate(fd, (off_t)c->map_bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(c->name);
        free(c);
        return fail(HCCL_E_SYSCALL, "%s: rank %u: ftruncate(%s) failed: %s", what, rank,
                    root.shm_name, strerror(e));
    }
    void *map = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        int e = errno;
        size_t bytes = c->map_bytes;
        shm_unlink(c->name);
        free(c);
        return fail(HCCL_E_MEMORY, "%s: rank %u: mmap of %zu bytes failed: %s", what, rank,
                    bytes, strerror(e));
    }
    c->hdr = (sim_hdr_t *)map;
    c->data = (char *)map + SIM_HDR_BYTES;
    sim_hdr_t *h = c->hdr;

    HcclResult res = HCCL_SUCCESS;
    uint32_t expect = 0;
    if (!atomic_compare_exchange_strong(&h->nranks, &expect, nRanks) && expect != nRanks) {
        res = fail(HCCL_E_PARA, "%s: rank %u: nRanks=%u but another rank of this root info "
                   "said %u", what, rank, nRanks, expect);
        goto out_fail;
    }
    int32_t no_pid = 0;
    if (!atomic_compare_exchange_strong(&h->ranks[rank].pid, &no_pid, (int32_t)getpid())) {
        res = fail(HCCL_E_PARA, "%s: rank %u already attached by pid %d", what, rank, no_pid);
        goto out_fail;
    }
    if (atomic_fetch_add(&h->nattached, 1) + 1 == nRanks)
        shm_unlink(c->name); /* group complete: the kernel now frees it with its last user */
    ring(h);

    c->share = (root.buffer_bytes / nRanks) & ~(size_t)63;
    c->p2p_bytes = ((c->share / 4) / nRanks) & ~(size_t)63;
    c->half_bytes = ((c->share - c->p2p_bytes * nRanks) / 2) & ~(size_t)63;
    c->magic = SIM_COMM_MAGIC;

    res = wait_for(c, pending_attach, NULL, what);
    if (rank == 0)
        sim_host_release(root.shm_name); /* every rank has connected or given up */
    if (res != HCCL_SUCCESS) {
        shm_unlink(c->name); /* the group never completed: do not leave the name behind */
        goto out_fail;
    }
    *comm = c;
    return HCCL_SUCCESS;

out_fail:
    c->magic = 0;
    munmap(map, c->map_bytes);
    free(c);
    return res;
}

HcclResult HcclCommDestroy(HcclComm comm)
{
    sim_comm_t *c = (sim_comm_t *)comm;
    if (c == NULL)
        return fail(HCCL_E_PTR, "HcclCommDestroy: comm is NULL");
    if (c->magic != SIM_COMM_MAGIC)
        return fail(HCCL_E_PARA, "HcclCommDestroy: comm is not a live simulator communicator");
    c->magic = 0;
    shm_unlink(c->name); /* normally gone already; harmless (ENOENT) then */
    munmap(c->hdr, c->map_bytes);
    free(c);
    return HCCL_SUCCESS;
}

HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize)
{
    sim_comm_t *c = NULL;
    HcclResult r = check_comm(comm, "HcclGetRankSize", &c);
    if (r != HCCL_SUCCESS)
        return r;
    if (rankSize == NULL)
        return fail(HCCL_E_PTR, "HcclGetRankSize: rankSize is NULL");
    *rankSize = c->nranks;
    return HCCL_SUCCESS;
}

HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank)
{
    sim_comm_t *c = NULL;
    HcclResult r = check_comm(comm, "HcclGetRankId", &c);
    if (r != HCCL_SUCCESS)
        return r;
    if (rank == NULL)
        return fail(HCCL_E_PTR, "HcclGetRankId: rank is NULL");
    *rank = c->rank;
    return HCCL_SUCCESS;
}

/* ------------------------------------------------------------------------------------ */
/* collectives                                                                           */

#define CHECK(expr)                        \
    do {                                   \
        HcclResult r_ = (expr);            \
        if (r_ != HCCL_SUCCESS)            \
            return r_;                     \
    } while (0)

static HcclResult check_buf(const sim_comm_t *c, const void *p, uint64_t count, const char *what,
                            const char *arg)
{
    if (count > 0 && p == NULL)
        return fail(HCCL_E_PTR, "%s: rank %u: %s is NULL", what, c->rank, arg);
    return HCCL_SUCCESS;
}

/* Reductions on an Atlas A2 (910B), per the HcclAllReduce / HcclReduceScatter API
 * reference (CANN hcclapiref, "dataType"): int8, int16, int32, int64, float16, float32 and
 * bfp16 only (no unsigned types, no float64); "prod" takes neither int16 nor bfp16. The
 * simulator can reduce every type, and refuses what the device refuses. */
static int device_reduces(HcclDataType dt)
{
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: case HCCL_DATA_TYPE_INT16: case HCCL_DATA_TYPE_INT32:
    case HCCL_DATA_TYPE_INT64: case HCCL_DATA_TYPE_FP16: case HCCL_DATA_TYPE_FP32:
    case HCCL_DATA_TYPE_BFP16:
        return 1;
    default:
        return 0;
    }
}

static HcclResult check_dtype(const sim_comm_t *c, HcclDataType dt, int reducing,
                              const char *what)
{
    if (dtype_size(dt) == 0 || (reducing && (reducer(dt) == NULL || !device_reduces(dt))))
        return fail(HCCL_E_NOT_SUPPORT, "%s: rank %u: data type %d not supported%s", what,
                    c->rank, (int)dt, reducing ? " for reductions (Atlas A2: int8, int16, "
                    "int32, int64, float16, float32, bfp16)" : "");
    return HCCL_SUCCESS;
}

static HcclResult check_reduce(const sim_comm_t *c, HcclDataType dt, HcclReduceOp op,
                               const char *what)
{
    if (op == HCCL_REDUCE_PROD && (dt == HCCL_DATA_TYPE_INT16 || dt == HCCL_DATA_TYPE_BFP16))
        return fail(HCCL_E_NOT_SUPPORT, "%s: rank %u: reduce op prod does not support data "
                    "type %d (int16, bfp16)", what, c->rank, (int)dt);
    return HCCL_SUCCESS;
}

static HcclResult check_op(const sim_comm_t *c, HcclReduceOp op, const char *what)
{
    if ((int)op < 0 || op >= HCCL_REDUCE_RESERVED)
        return fail(HCCL_E_PARA, "%s: rank %u: reduce op %d not supported", what, c->rank,
                    (int)op);
    return HCCL_SUCCESS;
}

HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType,
                         HcclReduceOp op, HcclComm comm, aclrtStream stream)
{
    const char *what = "HcclAllReduce";
    sim_comm_t *c = NULL;
    (void)stream;
    CHECK(check_comm(comm, what, &c));
    CHECK(check_dtype(c, dataType, 1, what));
    CHECK(check_reduce(c, dataType, op, what));
    CHECK(check_op(c, op, what));
    CHECK(check_buf(c, sendBuf, count, what, "sendBuf"));
    CHECK(check_buf(c, recvBuf, count, what, "recvBuf"));
    const size_t es = dtype_size(dataType);
    const reduce_fn reduce = reducer(dataType);
    const size_t chunk = c->half_bytes / es;
    const uint32_t n = c->nranks, me = c->rank;
    const void *srcs[SIM_MAX_RANKS];
    for (uint64_t off = 0; off < count; off += chunk) {
        size_t len = count - off < chunk ? (size_t)(count - off) : chunk;
        uint32_t h = next_half(c);
        memcpy(slot(c, me, h), (const char *)sendBuf + off * es, len * es);
        CHECK(barrier(c, what));
        /* reduce my share [lo, hi) of the chunk into my own slot */
        size_t lo = len * me / n, hi = len * (me + 1) / n;
        if (hi > lo) {
            for (uint32_t j = 0; j < n; j++)
                srcs[j] = slot(c, j, h) + lo * es;
            reduce(slot(c, me, h) + lo * es, srcs, (int)n, hi - lo, op);
        }
        CHECK(barrier(c, what));
        for (uint32_t j = 0; j < n; j++) {
            size_t jlo = len * j / n, jhi = len * (j + 1) / n;
            memcpy((char *)recvBuf + (off + jlo) * es, slot(c, j, h) + jlo * es, (jhi - jlo) * es);
        }
    }
    return HCCL_SUCCESS;
}

HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root,
                         HcclComm comm, aclrtStream stream)
{
    const char *what = "HcclBroadcast";
    sim_comm_t *c = NULL;
    (void)stream;
    CHECK(check_comm(comm, what, &c));
    CHECK(check_dtype(c, dataType, 0, what));
    CHECK(check_buf(c, buf, count, what, "buf"));
    if (root >= c->nranks)
        return fail(HCCL_E_PARA, "%s: rank %u: root %u is not below nRanks=%u", what, c->rank,
                    root, c->nranks);
    const size_t es = dtype_size(dataType);
    const size_t chunk = c->half_bytes / es;
    for (uint64_t off = 0; off < count; off += chunk) {
        size_t len = count - off < chunk ? (size_t)(count - off) : chunk;
        uint32_t h = next_half(c);
        if (c->rank == root)
            memcpy(slot(c, root, h), (const char *)buf + off * es, len * es);
        CHECK(barrier(c, what));
        if (c->rank != root)
            memcpy((char *)buf + off * es, slot(c, root, h), len * es);
    }
    return HCCL_SUCCESS;
}

HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType,
                         HcclComm comm, aclrtStream stream)
{
    const char *what = "HcclAllGather";
    sim_comm_t *c = NULL;
    (void)stream;
    CHECK(check_comm(comm, what, &c));
    CHECK(check_dtype(c, dataType, 0, what));
    CHECK(check_buf(c, sendBuf, sendCount, what, "sendBuf"));
    CHECK(check_buf(c, recvBuf, sendCount, what, "recvBuf"));
    const size_t es = dtype_size(dataType);
    const size_t chunk = c->half_bytes / es;
    for (uint64_t off = 0; off < sendCount; off += chunk) {
        size_t len = sendCount - off < chunk ? (size_t)(sendCount - off) : chunk;
        uint32_t h = next_half(c);
        memcpy(slot(c, c->rank, h), (const char *)sendBuf + off * es, len * es);
        CHECK(barrier(c, what));
        for (uint32_t j = 0; j < c->nranks; j++)
            memcpy((char *)recvBuf + (j * sendCount + off) * es, slot(c, j, h), len * es);
    }
    return HCCL_SUCCESS;
}

HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount,
                             HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                             aclrtStream stream)
{
    const char *what = "HcclReduceScatter";
    sim_comm_t *c = NULL;
    (void)stream;
    CHECK(check_comm(comm, what, &c));
    CHECK(check_dtype(c, dataType, 1, what));
    CHECK(check_reduce(c, dataType, op, what));
    CHECK(check_op(c, op, what));
    CHECK(check_buf(c, sendBuf, recvCount, what, "sendBuf"));
    CHECK(check_buf(c, recvBuf, recvCount, what, "recvBuf"));
    const size_t es = dtype_size(dataType);
    const reduce_fn reduce = reducer(dataType);
    const uint32_t n = c->nranks, me = c->rank;
    const size_t chunk = c->half_bytes / n / es; /* elements per destination per round */
    const void *srcs[SIM_MAX_RANKS];
    for (uint64_t off = 0; off < recvCount; off += chunk) {
        size_t len = recvCount - off < chunk ? (size_t)(recvCount - off) : chunk;
        uint32_t h = next_half(c);
        for (uint32_t j = 0; j < n; j++)
            memcpy(slot(c, me, h) + j * chunk * es,
                   (const char *)sendBuf + (j * recvCount + off) * es, len * es);
        CHECK(barrier(c, what));
        for (uint32_t j = 0; j < n; j++)
            srcs[j] = slot(c, j, h) + me * chunk * es;
        reduce((char *)recvBuf + off * es, srcs, (int)n, len, op);
    }
    return HCCL_SUCCESS;
}

HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount, HcclDataType sendType,
                        const void *recvBuf, uint64_t recvCount, HcclDataType recvType,
                        HcclComm comm, aclrtStream stream)
{
    const char *what = "HcclAlltoAll";
    sim_comm_t *c = NULL;
    (void)stream;
    CHECK(check_comm(comm, what, &c));
    CHECK(check_dtype(c, sendType, 0, what));
    if (sendType != recvType || sendCount != recvCount)
        return fail(HCCL_E_PARA, "%s: rank %u: send (%llu x type %d) and receive (%llu x type "
                    "%d) must match", what, c->rank, (unsigned long long)sendCount,
                    (int)sendType, (unsigned long long)recvCount, (int)recvType);
    CHECK(check_buf(c, sendBuf, sendCount, what, "sendBuf"));
    CHECK(check_buf(c, recvBuf, recvCount, what, "recvBuf"));
    const size_t es = dtype_size(sendType);
    const uint32_t n = c->nranks, me = c->rank;
    const size_t chunk = c->half_bytes / n / es;
    for (uint64_t off = 0; off < sendCount; off += chunk) {
        size_t len = sendCount - off < chunk ? (size_t)(sendCount - off) : chunk;
        uint32_t h = next_half(c);
        for (uint32_t j = 0; j < n; j++)
            memcpy(slot(c, me, h) + j * chunk * es,
                   (const char *)sendBuf + (j * sendCount + off) * es, len * es);
        CHECK(barrier(c, what));
        for (uint32_t j = 0; j < n; j++)
            memcpy((char *)recvBuf + (j * recvCount + off) * es, slot(c, j, h) + me * chunk * es,
                   len * es);
    }
    return HCCL_SUCCESS;
}

HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts, const void *sdispls,
                         HcclDataType sendType, const void *recvBuf, const void *recvCounts,
                         const void *rdispls, HcclDataType recvType, HcclComm comm,
                         aclrtStream stream)
{
    const char *what = "HcclAlltoAllV";
    sim_comm_t *c = NULL;
    (void)stream;
    CHECK(check_comm(comm, what, &c));
    CHECK(check_dtype(c, sendType, 0, what));
    if (sendType != recvType)
        return fail(HCCL_E_PARA, "%s: rank %u: send type %d and receive type %d differ", what,
                    c->rank, (int)sendType, (int)recvType);
    if (!sendCounts || !sdispls || !recvCounts || !rdispls)
        return fail(HCCL_E_PTR, "%s: rank %u: a count or displacement array is NULL", what,
                    c->rank);
    const uint64_t *scnt = sendCounts, *sdsp = sdispls, *rcnt = recvCounts, *rdsp = rdispls;
    const size_t es = dtype_size(sendType);
    const uint32_t n = c->nranks, me = c->rank;
    const size_t chunk = c->half_bytes / n / es;
    uint64_t rounds = 0, total_s = 0, total_r = 0;
    for (uint32_t j = 0; j < n; j++) {
        uint64_t rs = (scnt[j] + chunk - 1) / chunk, rr = (rcnt[j] + chunk - 1) / chunk;
        rounds = rs > rounds ? rs : rounds;
        rounds = rr > rounds ? rr : rounds;
        total_s += scnt[j];
        total_r += rcnt[j];
    }
    CHECK(check_buf(c, sendBuf, total_s, what, "sendBuf"));
    CHECK(check_buf(c, recvBuf, total_r, what, "recvBuf"));
    /* agree on the number of rounds: the maximum over all ranks */
    uint32_t s = c->sseq;
    c->sseq ^= 1u;
    atomic_store(&c->hdr->scratch[s][me], rounds);
    CHECK(barrier(c, what));
    for (uint32_t j = 0; j < n; j++) {
        uint64_t v = atomic_load(&c->hdr->scratch[s][j]);
        rounds = v > rounds ? v : rounds;
    }
    for (uint64_t t = 0; t < rounds; t++) {
        uint64_t off = t * chunk;
        uint32_t h = next_half(c);
        for (uint32_t j = 0; j < n; j++) {
            if (scnt[j] > off) {
                uint64_t len = scnt[j] - off < chunk ? scnt[j] - off : chunk;
                memcpy(slot(c, me, h) + j * chunk * es,
                       (const char *)sendBuf + (sdsp[j] + off) * es, len * es);
            }
        }
        CHECK(barrier(c, what));
        for (uint32_t j = 0; j < n; j++) {
            if (rcnt[j] > off) {
                uint64_t len = rcnt[j] - off < chunk ? rcnt[j] - off : chunk;
                memcpy((char *)recvBuf + (rdsp[j] + off) * es, slot(c, j, h) + me * chunk * es,
                       len * es);
            }
        }
    }
    return HCCL_SUCCESS;
}

HcclResult HcclBarrier(HcclComm comm, aclrtStream stream)
{
    sim_comm_t *c = NULL;
    (void)stream;
    CHECK(check_comm(comm, "HcclBarrier", &c));
    return barrier(c, "HcclBarrier");
}

/* ------------------------------------------------------------------------------------ */
/* point to point: channel src->dst = the segment dst of src's p2p area, one chunk in flight */

typedef struct {
    uint32_t src, dst;
    int want_data; /* receiver waits for sent != acked; sender for sent == acked */
} chan_wait_t;

static int pending_chan(const sim_comm_t *c, const void *arg)
{
    const chan_wait_t *w = arg;
    sim_chan_t *ch = &c->hdr->chan[w->src][w->dst];
    uint32_t sent = atomic_load_explicit(&ch->sent, memory_order_acquire);
    uint32_t acked = atomic_load_explicit(&ch->acked, memory_order_acquire);
    int ready = w->want_data ? sent != acked : sent == acked;
    return ready ? -1 : (int)(w->want_data ? w->src : w->dst);
}

static HcclResult check_peer(const sim_comm_t *c, uint32_t peer, const char *what)
{
    if (peer >= c->nranks)
        return fail(HCCL_E_PARA, "%s: rank %u: peer %u is not below nRanks=%u", what, c->rank,
                    peer, c->nranks);
    if (peer == c->rank)
        return fail(HCCL_E_PARA, "%s: rank %u: sending to or receiving from itself is not "
                    "supported", what, c->rank);
    return HCCL_SUCCESS;
}

HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank,
                    HcclComm comm, aclrtStream stream)
{
    const char *what = "HcclSend";
    sim_comm_t *c = NULL;
    (void)stream;
    CHECK(check_comm(comm, what, &c));
    CHECK(check_dtype(c, dataType, 0, what));
    CHECK(check_peer(c, destRank, what));
    CHECK(check_buf(c, sendBuf, count, what, "sendBuf"));
    sim_chan_t *ch = &c->hdr->chan[c->rank][destRank];
    char *seg = p2p_seg(c, c->rank, destRank);
    const chan_wait_t free_slot = {c->rank, destRank, 0};
    const uint64_t bytes = count * dtype_size(dataType);
    for (uint64_t off = 0; off < bytes; off += c->p2p_bytes) {
        uint64_t len = bytes - off < c->p2p_bytes ? bytes - off : c->p2p_bytes;
        CHECK(wait_for(c, pending_chan, &free_slot, what));
        memcpy(seg, (const char *)sendBuf + off, len);
        atomic_store_explicit(&ch->len, len, memory_order_relaxed);
        atomic_fetch_add_explicit(&ch->sent, 1, memory_order_seq_cst);
        ring(c->hdr);
    }
    /* return once the receiver has everything: the segment is free for the next send */
    return wait_for(c, pending_chan, &free_slot, what);
}

HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank,
                    HcclComm comm, aclrtStream stream)
{
    const char *what = "HcclRecv";
    sim_comm_t *c = NULL;
    (void)stream;
    CHECK(check_comm(comm, what, &c));
    CHECK(check_dtype(c, dataType, 0, what));
    CHECK(check_peer(c, srcRank, what));
    CHECK(check_buf(c, recvBuf, count, what, "recvBuf"));
    sim_chan_t *ch = &c->hdr->chan[srcRank][c->rank];
    const char *seg = p2p_seg(c, srcRank, c->rank);
    const chan_wait_t has_data = {srcRank, c->rank, 1};
    const uint64_t bytes = count * dtype_size(dataType);
    for (uint64_t off = 0; off < bytes; off += c->p2p_bytes) {
        uint64_t len = bytes - off < c->p2p_bytes ? bytes - off : c->p2p_bytes;
        CHECK(wait_for(c, pending_chan, &has_data, what));
        uint64_t got = atomic_load_explicit(&ch->len, memory_order_relaxed);
        if (got != len) {
            c->broken = 1;
            return fail(HCCL_E_PARA, "%s: rank %u: rank %u sent a chunk of %llu bytes where %llu "
                        "were expected (count or data type of HcclSend/HcclRecv differ)", what,
                        c->rank, srcRank, (unsigned long long)got, (unsigned long long)len);
        }
        memcpy((char *)recvBuf + off, seg, len);
        atomic_fetch_add_explicit(&ch->acked, 1, memory_order_seq_cst);
        ring(c->hdr);
    }
    return HCCL_SUCCESS;
}
