"""vLLM's async-scheduling input ids, placed with numpy instead of a per-request loop.

Under async scheduling (the NPU platform keeps it on: a device overlaps it with its work)
the tokens a decode request sampled last step are still on the device when the next step
is prepared; vLLM's `GPUModelRunner._prepare_input_ids` finds where each goes with a
Python loop over every request (prev position, flattened index, draft lengths): ~2 us per
request per step, ~0.3 ms of a 128-request step on the simulated NPU, where the host's
time is not hidden behind a device's. Without draft tokens (no speculative decoding this
step) that loop reduces to array arithmetic, done here; every other case (drafts, prompt
embeddings, a pipeline-parallel receive to wait on, no previous tokens) is vLLM's own
method. The result is the same tensor writes (tests/worker/test_async_input_ids.py runs
both on the same batches). Can go when vLLM vectorises the loop itself.
"""
from __future__ import annotations

import numpy as np
import torch


class VectorisedAsyncInputIds:
    """Mixin for a GPUModelRunner subclass."""

    def _prepare_input_ids(self, scheduler_output, num_reqs: int,
                           total_num_scheduled_tokens: int, cu_num_tokens: np.ndarray) -> None:
        batch = self.input_batch
        if (batch.prev_sampled_token_ids is None or self._pp_recv_work is not None
                or self.enable_prompt_embeds or scheduler_output.scheduled_spec_decode_tokens):
            return super()._prepare_input_ids(scheduler_output, num_reqs,
                                              total_num_scheduled_tokens, cu_num_tokens)
        prev_positions = self.prev_positions.np[:num_reqs]
        common = prev_positions >= 0
        prev_indices = prev_positions[common]
        # the flattened input position of each common request's (only) new token
        flattened = cu_num_tokens[:num_reqs][common].astype(np.int64) - 1
        num_common = len(flattened)
        if num_common < total_num_scheduled_tokens:
            self.input_ids.copy_to_gpu(total_num_scheduled_tokens)
        if num_common == 0:
            return
        if flattened[-1] == num_common - 1 and np.array_equal(prev_indices, flattened):
            # unchanged batch, no reordering: one slice
            self.input_ids.gpu[:num_common].copy_(
                batch.prev_sampled_token_ids[:num_common, 0], non_blocking=True)
            return
        index = torch.from_numpy(flattened).to(self.device, non_blocking=True)
        prev = torch.from_numpy(prev_indices).to(self.device, non_blocking=True)  # int64
        self.input_ids.gpu.scatter_(0, index, batch.prev_sampled_token_ids[prev, 0])
