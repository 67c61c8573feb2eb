/* The simulated NPU's index kernels, run once per step on small integer and logit rows:
 * vLLM's token -> KV slot mapping (its Triton kernel `ComputeSlotMappingKernel`, replaced
 * through the platform's kernel overrides, vllm_npu/worker/slot_mapping.py) and the greedy
 * sampler's argmax over each row of logits (vllm_npu/worker/sampler.py).
 *
 * Each replaces a chain of torch calls on the host's one thread: the slot mapping ~10 ops
 * (~50 us a step for 128 decode requests), the argmax torch's scalar reduction (~70 us for
 * 128 rows of 408 logits); here a few microseconds each.
 */
#include <math.h>
#include <stdint.h>

#include "sim_math.h"
#include "sim_vec.h"

/* slot_mapping[t] for the tokens of requests [0, num_reqs) (request i: tokens
 * [qsl[i], qsl[i + 1]), positions[t]); PAD past num_tokens up to max_num_tokens. With
 * context parallelism (world W, interleave I) a request's virtual block spans bs * W
 * positions; position p is stored on rank (off // I) % W, the other ranks get PAD:
 *   vblock = p / (bs W), off = p % (bs W),
 *   slot = table[req][vblock] * bs + (off / (W I)) * I + off % I
 * Returns 0; -1 when the request starts are not a partition of [0, num_tokens); 1 + t when
 * token t's position is negative or past the request's table row (nothing is read there;
 * slots before t are written). */
EXPORT int64_t npu_sim_slot_mapping(int64_t num_tokens, int64_t max_num_tokens,
                                    const int32_t *qsl, int64_t num_reqs,
                                    const int64_t *positions, const int32_t *table,
                                    int64_t stride, int64_t *slots, int64_t bs, int64_t world,
                                    int64_t rank, int64_t inter, int64_t pad) {
    if (num_reqs < 0 || qsl[0] != 0 || qsl[num_reqs] != num_tokens) return -1;
    const int64_t vbs = bs * world;
    for (int64_t i = 0; i < num_reqs; i++) {
        const int64_t t0 = qsl[i], t1 = qsl[i + 1];
        if (t1 < t0) return -1;
        const int32_t *row = table + i * stride;
        for (int64_t t = t0; t < t1; t++) {
            const int64_t p = positions[t], vblock = p / vbs, off = p % vbs;
            if (p < 0 || vblock >= stride) return 1 + t;
            if (world > 1 && (off / inter) % world != rank) {
                slots[t] = pad;
                continue;
            }
            slots[t] = (int64_t)row[vblock] * bs + (off / (world * inter)) * inter + off % inter;
        }
    }
    for (int64_t t = num_tokens; t < max_num_tokens; t++) slots[t] = pad;
    return 0;
}

/* out[r] = the index of the first maximum of row r (cols floats, rows ld apart), the first
 * NaN where the row has one: torch.argmax's result on the CPU (aten/src/ATen/native/
 * ReduceOps: NaN compares greater than every number, ties go to the lower index). */
CLONES
EXPORT void npu_sim_argmax_rows(const float *x, int64_t rows, int64_t cols, int64_t ld,
                                int64_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        int64_t j = 0;
        v16 top = (v16){0} - INFINITY;
        v16i nan = {0};
        for (; j + 16 <= cols; j += 16) {
            const v16 v = ld16(row + j);
            nan |= v != v;
            top = max16(top, v);
        }
        float best = hmax16(top);
        int any_nan = 0;
        for (int l = 0; l < 16; l++) any_nan |= nan[l];
        for (; j < cols; j++) {
            any_nan |= row[j] != row[j];
            best = row[j] > best ? row[j] : best;
        }
        int64_t at = 0;
        if (any_nan) {
            while (row[at] == row[at]) at++;
        } else {
            while (at < cols - 1 && row[at] != best) at++;
        }
        out[r] = at;
    }
}
