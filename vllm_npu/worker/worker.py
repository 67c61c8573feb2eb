"""NPUWorker: vLLM's GPU worker, re-based on the NPU (real or simulated).

Overrides only what is device-specific: device/distributed init, the KV-cache budget from
a profile run, warm-up (no CUDA kernel warm-up), sleep/wake, and the memory-pool context
(no CuMem allocator). The step itself (execute_model / sample_tokens) is vLLM's.
"""
from __future__ import annotations

import contextlib
import gc
import logging

import torch
from vllm.config import CompilationMode, CUDAGraphMode
from vllm.platforms import current_platform
from vllm.utils.gc_utils import freeze_gc_heap
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

from vllm_npu.device import log_backend, select_backend
from vllm_npu.distributed.kv_transfer.config import check_worker_connector
from vllm_npu.fork_safety import claim_simulated_npu
from vllm_npu.ops.sim import cores
from vllm_npu.worker.accelerator import on_npu_runtime
from vllm_npu.worker.kv_poll import pause_if_only_polling
from vllm_npu.ops.sim.memory import PeakMemoryTracker, keep_freed_heap, register_resident
from vllm_npu.worker.sleep import SleepState

logger = logging.getLogger("vllm.npu")
GiB = 1 << 30


class NPUWorker(Worker):
    simulated = select_backend().simulated

    # ---- device ---------------------------------------------------------------------
    @on_npu_runtime
    def init_device(self) -> None:
        # vLLM's startup runs ~11 full collections (model loading, memory profiling, graph
        # capture), each walking the ~0.7M objects the imports left (~0.2-0.3 s apiece on
        # a 2-core host); collected and frozen now, they are skipped: an in-process engine
        # of the tiny model starts in ~3.5 s instead of ~5.1 (docs/performance.md). Graph
        # capture unfreezes the heap and collects once, as before.
        freeze_gc_heap()
        log_backend()
        if self.simulated:
            claim_simulated_npu()  # refused in a child forked after the parent claimed it
            self.device = torch.device("cpu")
            keep_freed_heap()  # device memory that is reused, not returned to the OS
            parallel = self.parallel_config  # ranks sharing this host's CPUs
            cores.set_ranks_on_host(parallel.local_world_size
                                    * max(1, parallel.data_parallel_size_local))
        else:
            self.device = torch.device(f"npu:{self.local_rank}")
            current_platform.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(self.vllm_config, self.rank,
                                            self.distributed_init_method, self.local_rank,
                                            current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        self._sleep = SleepState()
        self._init_workspace_and_model_runner()

    def _make_model_runner(self):
        from vllm_npu.worker.model_runner import NPUModelRunner

        return NPUModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str) -> contextlib.AbstractContextManager:
        # Sleep mode works on tensors' storages directly (worker/sleep.py), no CuMem pool.
        return contextlib.nullcontext()

    # ---- the vLLM calls that may reach torch.accelerator --------------------------------
    @on_npu_runtime
    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights=load_dummy_weights)
        if self.simulated:
            model = self.model_runner.get_model()
            register_resident(list(model.parameters()) + list(model.buffers()))

    @on_npu_runtime
    def initialize_from_config(self, kv_cache_config) -> None:
        check_worker_connector(self.vllm_config)  # before vLLM builds the connector's worker
        super().initialize_from_config(kv_cache_config)
        if self.simulated:
            register_resident(t for t in self.model_runner.kv_caches if t is not None)

    @on_npu_runtime
    def execute_model(self, scheduler_output):
        output = super().execute_model(scheduler_output)
        pause_if_only_polling(scheduler_output, output)
        return output

    @on_npu_runtime
    def sample_tokens(self, grammar_output):
        return super().sample_tokens(grammar_output)

    @on_npu_runtime
    def take_draft_token_ids(self):
        return super().take_draft_token_ids()

    @on_npu_runtime
    def execute_dummy_batch(self) -> None:
        super().execute_dummy_batch()

    @on_npu_runtime
    def reload_weights(self, *args, **kwargs) -> None:
        super().reload_weights(*args, **kwargs)

    @on_npu_runtime
    def shutdown(self) -> None:
        super().shutdown()

    # ---- KV cache budget --------------------------------------------------------------
    @on_npu_runtime
    @torch.inference_mode()
    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: capacity * gpu_memory_utilization - weights - peak
        activations of a profile run at the largest batch (as on a device)."""
        explicit = self.cache_config.kv_cache_memory_bytes
        model = self.model_runner.get_model()
        weight_bytes = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                            for t in list(model.parameters()) + list(model.buffers())}.values())
        if self.simulated:
            if self.compilation_config.mode != CompilationMode.NONE:
                # Dynamo refuses to trace under a dispatch mode: compile first, measure after.
                self.model_runner.profile_run()
            tracker = PeakMemoryTracker(
                ignore={t.untyped_storage().data_ptr() for t in model.parameters()})
            with tracker:
                self.model_runner.profile_run()
            peak, non_torch = tracker.peak, 0
        else:
            gc.collect()
            torch.npu.empty_cache()
            torch.npu.reset_peak_memory_stats()
            free0, total0 = torch.npu.mem_get_info()
            self.model_runner.profile_run()
            peak = torch.npu.max_memory_allocated() - weight_bytes
            non_torch = max(0, (total0 - free0) - torch.npu.memory_reserved())
        self.profiled_bytes = dict(weights=weight_bytes, activations=peak, non_torch=non_torch)
        if explicit is not None:
            return int(explicit)
        total = current_platform.get_device_total_memory(self.local_rank)
        util = self.cache_config.gpu_memory_utilization
        budget = int(total * util) - weight_bytes - peak - non_torch
        logger.info("vllm_npu: KV cache budget %.3f GiB = %.2f GiB x %.2f - weights %.3f GiB "
                    "- peak activations %.3f GiB - non-torch %.3f GiB", budget / GiB,
                    total / GiB, util, weight_bytes / GiB, peak / GiB, non_torch / GiB)
        if budget <= 0:
            raise ValueError(
                f"No NPU memory left for the KV cache: {total / GiB:.2f} GiB x "
                f"gpu_memory_utilization {util} leaves {budget / GiB:.3f} GiB after weights "
                f"({weight_bytes / GiB:.3f} GiB) and activations ({peak / GiB:.3f} GiB). "
                "Raise --gpu-memory-utilization, lower --max-num-batched-tokens, set "
                "--kv-cache-memory-bytes" + (", or raise NPU_SIM_MEMORY_GB" if self.simulated
                                             else "") + ".")
        return budget

    @on_npu_runtime
    def compile_or_warm_up_model(self) -> CompilationTimes:
        # Capture the ACL graphs (vLLM's runner drives the sizes, warm-ups and progress
        # bar); vLLM's CUDA kernel warm-up does not apply to the NPU.
        if self.compilation_config.cudagraph_mode != CUDAGraphMode.NONE:
            self.model_runner.capture_model()
        if self.model_runner.npu_eplb is not None:
            self.model_runner.npu_eplb.finish_warm_up()
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(language_model=self.compilation_config.compilation_time,
                                encoder=self.compilation_config.encoder_compilation_time)

    # ---- sleep mode -------------------------------------------------------------------
    @on_npu_runtime
    def sleep(self, level: int = 1) -> None:
        freed = self._sleep.sleep(level, self.model_runner.get_model(),
                                  self.model_runner.kv_caches)
        logger.info("vllm_npu: sleep level %d freed %.3f GiB of NPU memory", level, freed / GiB)

    @on_npu_runtime
    def wake_up(self, tags: list[str] | None = None) -> None:
        self._sleep.wake_up(tags)

    def check_health(self) -> None:
        if not self.simulated:
            torch.npu.synchronize()  # surfaces a device fault as an exception
