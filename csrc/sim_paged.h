/* What the paged-attention kernels share (sim_kernels.c: the per-row kernel and the thread
 * pool; sim_prefill.c: tiles of prefill rows): the call's arguments, per-thread scratch. */
#ifndef NPU_SIM_PAGED_H
#define NPU_SIM_PAGED_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    const float *q, *q_rope;           /* [B, N, D] and [B, N, R], contiguous */
    const void *k, *k_rope, *v;        /* caches: float32 or bf16 bits (uint16) */
    int64_t k_blk, k_tok, k_head;      /* element strides; the last dim is contiguous */
    int64_t kr_blk, kr_tok, kr_head;
    int64_t v_blk, v_tok, v_head;
    const int32_t *table;              /* [B, table_stride] block ids */
    int64_t table_stride;
    const int64_t *first, *lens;       /* keys [first[b], lens[b]) of request b */
    float *out, *lse;                  /* [B, N, Dv]; [B, N] or NULL */
    int64_t B, N, H, D, R, Dv, bs;
    int64_t num_blocks;                /* every table entry read must be below it */
    float scale;
    int32_t bf16;
    const int64_t *row_of;             /* [B] table row of request b (NULL: row b); prefill
                                        * rows of one request share its row */
} pd_args;

typedef struct {
    float *scores;  /* [N, longest] */
    float *q;       /* [N, W]: scale * (q | q_rope), zero-padded to W */
    float *rows;    /* [8, W] widened key rows, or [8, Dv] value rows */
    float *acc;     /* [N, Dv] */
    size_t cap_scores, cap_q, cap_rows, cap_acc;
    float *tile;    /* sim_prefill.c's tile buffers */
    size_t cap_tile;
    int64_t next;   /* the decode row this thread runs next (-1: none known): its first
                     * keys are prefetched at the end of the current row */
} scratch;

static inline int grow(float **p, size_t *cap, size_t n) {
    if (*cap >= n) return 0;
    float *q = realloc(*p, n * sizeof(float));
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

static inline const int32_t *table_row(const pd_args *a, int64_t b) {
    return a->table + (a->row_of ? a->row_of[b] : b) * a->table_stride;
}

/* Rows r0 .. r0 + m - 1 of one request (one table row) as a tile: float32 caches, no
 * rope (`tile_fits`). 0, or -1 when scratch memory could not be allocated. */
__attribute__((visibility("hidden"))) int prefill_tile(const pd_args *a, int64_t r0, int64_t m,
                                                   scratch *s);
int tile_fits(const pd_args *a);

/* Decode row b (keys first[b] < lens[b]) in one pass (sim_decode.c): float32 caches, no
 * rope, head dims multiples of 16 (`decode_fits`). Needs scratch q [N, D], acc [N, Dv]. */
__attribute__((visibility("hidden"))) void decode_row(const pd_args *a, int64_t b, scratch *s);
int decode_fits(const pd_args *a);
/* rows per tile for this call's heads */
int64_t tile_rows(const pd_args *a);

#endif
