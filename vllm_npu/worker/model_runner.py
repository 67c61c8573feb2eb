"""NPUModelRunner: vLLM's V1 GPUModelRunner on the NPU.

vLLM's runner already turns a SchedulerOutput into one forward through the platform's
attention backend; only its CUDA-specific leaves change here:
  - slot mapping: vLLM's Triton kernel is replaced through the platform's
    `register_triton_kernel_overrides` (worker/slot_mapping.py), not here;
  - block zeroing: vectorised index_fill instead of a Triton kernel;
  - device -> host token copy: a plain `tolist()` on the simulated NPU (no events on CPU).
"""
from __future__ import annotations

import torch
from vllm.v1.worker.gpu_model_runner import GPUModelRunner


class NPUModelRunner(GPUModelRunner):
    def _zero_block_ids(self, block_ids: list[int]) -> None:
        """Zero whole KV blocks (needed by Mamba / mixed-precision KV layouts)."""
        if not block_ids or not getattr(self, "kv_caches", None):
            return
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        seen: set[int] = set()
        for kv in self.kv_caches:
            if kv is None or kv.data_ptr() in seen:
                continue
            seen.add(kv.data_ptr())
            kv.index_fill_(0, ids, 0)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        if self.device.type == "cpu":
            return sampled_token_ids.tolist()
        return super()._to_list(sampled_token_ids)
