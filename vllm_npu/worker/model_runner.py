"""NPUModelRunner: vLLM's V1 GPUModelRunner on the NPU.

vLLM's runner already turns a SchedulerOutput into one forward through the platform's
attention backend; only its CUDA-specific leaves change here:
  - slot mapping: vLLM's Triton kernel is replaced through the platform's
    `register_triton_kernel_overrides` (worker/slot_mapping.py), not here;
  - block zeroing: vectorised index_fill instead of a Triton kernel;
  - device -> host token copy: a plain `tolist()` on the simulated NPU (no events on CPU);
  - graphs: capture without vLLM's CUDA-only stream/communicator context; vLLM's
    CUDAGraphWrapper around the model becomes ACLGraphWrapper, and before each FULL
    replay the captured attention tasks are refreshed for the new batch;
  - prefill context parallelism (which vLLM's V1 runner lacks): each PCP rank runs the
    model on its chunk of the batch's tokens, the hidden states are all-gathered
    (attention/prefill_context_parallel.py);
  - seeded sampling: CPU generators (simulated NPU) are rewound by state, not by Philox
    offset, when a partial prefill's sample is discarded (worker/seeded_sampling.py);
  - async scheduling's input ids placed with numpy, not a loop per request
    (worker/async_input_ids.py);
  - greedy sampling's argmax as one native call on the simulated NPU (worker/sampler.py).
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import torch
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.compilation.monitor import set_cudagraph_capturing_enabled
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.workspace import lock_workspace

from vllm_npu.attention import prefill_context_parallel as pcp
from vllm_npu.compilation.acl_graph import ACLGraphWrapper
from vllm_npu.compilation.graph_params import GRAPH_PARAMS, update_attention_tasks
from vllm_npu.config import get_npu_config
from vllm_npu.device import select_backend
from vllm_npu.eplb.runtime.adaptor import moe_layers
from vllm_npu.moe import expert_map
from vllm_npu.ops.sim import cores
from vllm_npu.worker.async_input_ids import VectorisedAsyncInputIds
from vllm_npu.worker.sampler import use_sim_sampler
from vllm_npu.worker.seeded_sampling import CPUGeneratorRewind

logger = logging.getLogger("vllm.npu")


class NPUModelRunner(CPUGeneratorRewind, VectorisedAsyncInputIds, GPUModelRunner):
    npu_eplb = None  # EplbUpdator when EPLB is on (vLLM's own EplbState stays off)
    simulated = select_backend().simulated

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.simulated:
            use_sim_sampler(self.sampler)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        config = get_npu_config()
        export_path = config.moe.export_expert_map_path
        if export_path:
            placements = {v.layer_id: v.placement for v in moe_layers(self.get_model())}
            if written := expert_map.export_placements(placements, export_path):
                logger.info("vllm_npu: wrote the expert placement to %s", written)
        if config.eplb.enabled:
            from vllm_npu.eplb.runtime.adaptor import VllmEplbAdaptor
            from vllm_npu.eplb.runtime.transfer import EPGroup
            from vllm_npu.eplb.runtime.updator import EplbUpdator

            # Before graphs are captured: the layers' load counters move into its recorder.
            self.npu_eplb = EplbUpdator(VllmEplbAdaptor(self.get_model()), config.eplb,
                                        EPGroup.from_vllm(), export_path)
        if isinstance(self.model, CUDAGraphWrapper):
            self.model = ACLGraphWrapper(self.model.runnable, self.vllm_config,
                                         runtime_mode=CUDAGraphMode.FULL)
            layers = self.compilation_config.static_forward_context
            # Every FULL replay refreshes the attention tasks first, including the dummy
            # batches vLLM's _dummy_run replays on idle DP ranks (it calls the model
            # directly, not through _model_forward).
            self.model.before_replay = lambda ctx, event: update_attention_tasks(
                ctx, layers, event)

    def shutdown(self) -> None:
        """Also drop, before vLLM's own release (which sets `model` to None), the captured
        graphs (with the buffers and KV cache views their tasks hold) and the compiled
        model: Dynamo keeps every compiled backend, and with it the piecewise graph
        wrappers, for the life of the process (torch._dynamo.eval_frame.cached_backends),
        and a bytecode hook pins the compiled model. vLLM's LLMEngine finalizer would
        remove that hook, but it finds the model through a weak reference to
        `runner.model`, here the FULL graph wrapper, already gone by then. Without this an
        in-process engine's graphs and KV cache outlived it (vLLM drops graphs here only
        on ROCm)."""
        from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper

        ACLGraphWrapper.release_graphs(self.vllm_config)
        GRAPH_PARAMS.clear()
        model = getattr(self, "model", None)
        if model is not None:
            model = model.unwrap() if isinstance(model, ACLGraphWrapper) else model
            for module in model.modules():
                if isinstance(module, TorchCompileWithNoGuardsWrapper):
                    module.cleanup()
        super().shutdown()

    def capture_model(self) -> int:
        """Capture one ACL graph per BatchDescriptor vLLM's dispatcher asks for (largest
        first). vLLM's own capture_model enters a CUDA-only stream/communicator context;
        the rest — warm-ups, dummy batches, progress bar — is its `_capture_cudagraphs`."""
        if self.compilation_config.cudagraph_mode == CUDAGraphMode.NONE:
            return 0
        start = time.perf_counter()
        GRAPH_PARAMS.clear()  # tasks of graphs captured before (another engine) are stale
        captures_before = ACLGraphWrapper.stats.captures
        set_cudagraph_capturing_enabled(True)
        try:
            with self._freeze_gc():
                for mode, descs in self.cudagraph_dispatcher.get_capture_descs():
                    self._capture_cudagraphs(batch_descriptors=descs,
                                             cudagraph_runtime_mode=mode)
        finally:
            set_cudagraph_capturing_enabled(False)
        lock_workspace()
        if self.npu_eplb is not None:
            self.npu_eplb.recorder.clear()  # capture batches are not load
        logger.info("vllm_npu: captured %d ACL graphs in %.1f s",
                    ACLGraphWrapper.stats.captures - captures_before,
                    time.perf_counter() - start)
        return 0

    def eplb_step(self, is_dummy: bool = False, is_profile: bool = False) -> None:
        """vLLM calls this after every step (dummy ones too, so DP ranks stay in step)."""
        if self.npu_eplb is not None:
            self.npu_eplb.step(is_dummy, is_profile)

    def _model_forward(self, input_ids: torch.Tensor | None = None,
                       positions: torch.Tensor | None = None, intermediate_tensors=None,
                       inputs_embeds: torch.Tensor | None = None, **model_kwargs: Any) -> Any:
        world = self.parallel_config.prefill_context_parallel_size
        # eager forwards (prefill) compute on the simulated device's cores; a replay keeps
        # vLLM's one torch thread outside its matmuls (ops/sim/cores.py, graph.py)
        eager = self.simulated and \
            get_forward_context().cudagraph_runtime_mode != CUDAGraphMode.FULL
        with cores.device_compute_threads() if eager else contextlib.nullcontext():
            if world > 1:
                return self._pcp_forward(world, input_ids, positions, inputs_embeds,
                                         **model_kwargs)
            return super()._model_forward(input_ids=input_ids, positions=positions,
                                          intermediate_tensors=intermediate_tensors,
                                          inputs_embeds=inputs_embeds, **model_kwargs)

    def _pcp_forward(self, world: int, input_ids, positions, inputs_embeds, **model_kwargs):
        """This rank's chunk of the tokens through the model, then every rank's hidden
        states gathered in batch order (PP is refused with PCP at startup)."""
        from vllm.distributed.parallel_state import get_pcp_group

        group = get_pcp_group()
        num_tokens = positions.shape[-1]
        chunk = pcp.chunk_len(num_tokens, world)
        lo, hi = pcp.run_range(num_tokens, world, group.rank_in_group)

        def rows(x: torch.Tensor | None, dim: int = 0) -> torch.Tensor | None:
            return None if x is None else pcp.pad_rows(x.narrow(dim, lo, hi - lo), chunk, dim)

        with pcp.slice_active():
            hidden = super()._model_forward(
                input_ids=rows(input_ids), positions=rows(positions, -1),
                intermediate_tensors=None, inputs_embeds=rows(inputs_embeds), **model_kwargs)
        if not isinstance(hidden, torch.Tensor):
            raise NotImplementedError("prefill context parallelism: models returning "
                                      f"{type(hidden).__name__} (auxiliary hidden states)")
        return group.all_gather(hidden, dim=0)[:num_tokens]

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
