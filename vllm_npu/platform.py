"""NPUPlatform: vLLM's Platform for Ascend NPUs, real or simulated.

Identity per backend (see `vllm_npu.device`):

    attribute      real NPU     simulated NPU
    device_name    "npu"        "cpu"   vLLM builds torch.device(f"{device_name}:{i}") from
    device_type    "npu"        "cpu"   it (parallel_state), so in simulation it must name
    dispatch_key   PrivateUse1  CPU     a real torch device type; "npu" stays the name users
    dist_backend   hccl         gloo    see (`--device npu`, ray_device_key "NPU", logs).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import TYPE_CHECKING

import torch
import vllm.envs as vllm_envs
from vllm.platforms.interface import Platform, PlatformEnum

from vllm_npu import envs
from vllm_npu.config import NPUConfig, set_npu_config
from vllm_npu.device import log_backend, select_backend
from vllm_npu.distributed.kv_transfer.config import adopt_kv_transfer_config
from vllm_npu.registration import ATTENTION_BACKEND
from vllm_npu.fork_safety import prepare_to_fork_workers

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.utils.argparse_utils import FlexibleArgumentParser

logger = logging.getLogger("vllm.npu")
# vLLM turns on its breakable CUDA graphs for DeepSeek-V3.2-style models by setting this
# variable process-wide (VllmConfig._maybe_enable_breakable_cudagraph), which switches
# torch.compile off for that engine and every later one in the process. The NPU has no
# breakable graphs (ACL graphs are captured whole or piecewise); an explicit user setting
# still wins.
os.environ.setdefault("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
_BACKEND = select_backend()
SIMULATED = _BACKEND.simulated
if SIMULATED:
    # The simulated NPU compiles with the "eager" backend (check_and_update_config), which
    # vLLM never AOT-compiles ("Detected eager backend, disabling AOT compile",
    # vllm/compilation/decorators.py). With VLLM_USE_AOT_COMPILE on (vLLM's default from
    # torch 2.10) every later call of the compiled model still hashed the whole config and
    # looked for an artifact on disk: 2-8 ms per forward outside full graphs (prefills,
    # each piecewise capture). An explicit user setting still wins.
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
GiB = 1 << 30
PAGED_BLOCK_SIZES = (128, 256, 384, 512)  # what the fused attention op's page attention takes
SPECULATIVE_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
MAX_DRAFT_TOKENS = 15  # FIA: <= 16 query tokens per request per decode round


def _device_arg(value: str) -> str:
    if value != "npu":
        raise argparse.ArgumentTypeError(
            f"--device {value!r} is not available: the vllm_npu platform plugin is active "
            "and serves only --device npu (set NPU_PLUGIN_DISABLE=1 to let vLLM pick "
            "another platform)")
    return value


class NPUPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "cpu" if SIMULATED else "npu"
    device_type = "cpu" if SIMULATED else "npu"
    dispatch_key = "CPU" if SIMULATED else "PrivateUse1"
    dist_backend = "gloo" if SIMULATED else "hccl"
    ray_device_key = "NPU"
    device_control_env_var = "ASCEND_RT_VISIBLE_DEVICES"
    simple_compile_backend = "eager"
    # ModelSlim W8A8 / W8A8_DYNAMIC; vLLM's compressed-tensors int8 W8A8
    supported_quantization: list[str] = ["ascend", "compressed-tensors"]

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        # float32 runs on the simulated NPU only (exact parity tests); see check_if_supports_dtype.
        base = [torch.bfloat16, torch.float16]
        return base + [torch.float32] if SIMULATED else base

    # ---- identity and device queries -------------------------------------------------
    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        if SIMULATED:
            return "Ascend NPU (simulated)"
        return torch.npu.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        return f"npu-sim-{device_id}" if SIMULATED else f"npu-{device_id}"

    @classmethod
    def device_count(cls) -> int:
        if SIMULATED:
            return envs.NPU_SIM_DEVICE_COUNT.get()
        return torch.npu.device_count()

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        if SIMULATED:
            return int(envs.NPU_SIM_MEMORY_GB.get() * GiB)
        return torch.npu.get_device_properties(device_id).total_memory

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        if SIMULATED:
            from vllm_npu.ops.sim.memory import live_device_bytes

            return float(live_device_bytes())
        torch.npu.reset_peak_memory_stats(device)
        return float(torch.npu.max_memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        if not SIMULATED:
            torch.npu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.manual_seed(seed)
        if not SIMULATED:
            torch.npu.manual_seed_all(seed)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return not SIMULATED  # pinning needs an accelerator runtime

    def is_sleep_mode_available(self) -> bool:
        return True

    @classmethod
    def import_kernels(cls) -> None:
        """No vllm._C: every device op goes through vllm_npu.ops."""

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype == torch.float32 and not SIMULATED:
            raise ValueError(
                "float32 models are not supported on Ascend NPUs: the fused attention "
                "kernels take float16/bfloat16 only. Pass --dtype bfloat16 or float16.")

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        if quant not in cls.supported_quantization:
            raise ValueError(
                f"{quant} quantization is not supported on the NPU platform yet "
                # vLLM appends each registered method to this list ("ascend" again)
                f"(supported: {list(dict.fromkeys(cls.supported_quantization))}); load an "
                "unquantized or a ModelSlim W8A8 checkpoint")

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm_npu.distributed.communicator.NPUCommunicator"

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config,
                             num_heads: int | None = None) -> str:
        if getattr(attn_selector_config, "use_mla", False):
            from vllm_npu.attention.mla_select import select_mla_backend

            return select_mla_backend(selected_backend, attn_selector_config)
        if selected_backend is not None and selected_backend.name != "CUSTOM":
            raise ValueError(
                f"Attention backend {selected_backend.name} is not available on the NPU "
                "platform; valid: CUSTOM (the NPU paged-attention backend) or unset")
        return ATTENTION_BACKEND

    @classmethod
    def get_mla_prefill_backend_cls(cls, mla_selector_config):
        # One fixed prefill backend (the fused attention op), never a CUDA one.
        from vllm_npu.attention.mla_prefill import NPUMLAPrefillBackend

        reasons = NPUMLAPrefillBackend.validate_configuration(None, mla_selector_config)
        if reasons:
            raise ValueError(f"NPU MLA prefill backend cannot run this model: {reasons}")
        return NPUMLAPrefillBackend

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from vllm_npu.kernel_overrides import register_kernel_overrides

        register_kernel_overrides()

    # ---- CLI and configuration -------------------------------------------------------
    @classmethod
    def pre_register_and_update(cls, parser: "FlexibleArgumentParser | None" = None) -> None:
        # vLLM 0.33 dropped --device; Ascend users and scripts still pass `--device npu`.
        if parser is None or any("--device" in a.option_strings for a in parser._actions):
            return
        parser.add_argument("--device", type=_device_arg, default="npu",
                            help="Device to run on; with the vllm_npu plugin only 'npu'.")

    @classmethod
    def get_punica_wrapper(cls) -> str:
        return "vllm_npu.lora.punica_npu.NPUPunicaWrapper"

    @staticmethod
    def _take_over_ray(parallel) -> None:
        """Ray as users start it (vllm_npu/distributed/ray_executor.py): the Ray executor
        becomes the NPU one; DP over Ray connects Ray (counting simulated NPUs) here, before
        vLLM's DP engine manager calls a bare ray.init() in this process, and refuses too
        few NPUs. Scaled-out API servers launch no engines and skip it."""
        if parallel.distributed_executor_backend == "ray":
            from vllm_npu.distributed.ray_executor import NPURayExecutor

            parallel.distributed_executor_backend = NPURayExecutor
        launches_engines = parallel._api_process_count == 1 or parallel._api_process_rank == -1
        if parallel.data_parallel_backend != "ray" or parallel.data_parallel_size <= 1 \
                or not launches_engines:
            return
        from vllm_npu.distributed.ray_executor import check_enough_npus, connect_ray

        connect_ray()
        check_enough_npus(
            parallel.world_size * parallel.data_parallel_size,
            f"data parallel {parallel.data_parallel_size} x tensor "
            f"{parallel.tensor_parallel_size} x pipeline {parallel.pipeline_parallel_size} "
            f"x prefill context {parallel.prefill_context_parallel_size}")

    @classmethod
    def check_and_update_config(cls, vllm_config: "VllmConfig") -> None:
        log_backend()
        npu_config = NPUConfig.from_additional_config(vllm_config.additional_config)
        parallel = vllm_config.parallel_config
        cls._detect_modelslim(vllm_config)
        if parallel.enable_eplb:
            from vllm_npu.eplb.runtime.startup import take_over_eplb

            npu_config = take_over_eplb(vllm_config)
        set_npu_config(npu_config)

        if parallel.worker_cls == "auto":
            parallel.worker_cls = "vllm_npu.worker.worker.NPUWorker"
        if parallel.enable_dbo:
            logger.warning("vllm_npu: dual-batch overlap is not supported; disabled")
            parallel.enable_dbo = False

        cls._take_over_ray(parallel)
        world = parallel.world_size
        if parallel.nnodes <= 1 and not parallel.use_ray and world > cls.device_count():
            raise ValueError(
                f"World size {world} (tensor x pipeline x context parallel) exceeds the "
                f"{cls.device_count()} NPUs on this node"
                + (" (NPU_SIM_DEVICE_COUNT)" if SIMULATED else "")
                + "; use --distributed-executor-backend ray for multi-node serving")
        # what an earlier engine here left must not reach the processes vLLM starts
        prepare_to_fork_workers(SIMULATED, world > 1 or parallel.data_parallel_size > 1
                                or vllm_envs.VLLM_ENABLE_V1_MULTIPROCESSING)

        if parallel.prefill_context_parallel_size > 1:
            cls._check_prefill_context_parallel(vllm_config)
        cls._check_moe_dispatch(vllm_config, npu_config)
        adopt_kv_transfer_config(vllm_config)
        if vllm_config.speculative_config is not None:
            cls._check_speculative(vllm_config)
        if vllm_config.lora_config is not None and vllm_config.model_config.is_moe:
            # MoE LoRA needs the punica wrapper's fused-MoE entry points, which the NPU
            # wrapper does not provide yet (dense layers only).
            raise ValueError("--enable-lora with a MoE model is not supported on the NPU "
                             "platform yet (LoRA runs on dense layers only); serve the "
                             "adapter merged into the weights instead")

        aux = getattr(vllm_config, "aux_output_config", None)
        if aux is not None and aux.enabled:
            # vLLM wires aux outputs (routed experts) only into Model Runner V2, which
            # needs Triton, and leaves the check to out-of-tree platforms
            # (VllmConfig._verify_aux_output_compatibility): the NPU runs the V1 runner.
            raise ValueError("--enable-return-routed-experts is not supported on the NPU: "
                             "the AuxOutput Connector requires Model Runner V2, which the "
                             "NPU platform does not run; serve without it")

        cache = vllm_config.cache_config
        if cache.user_specified_block_size and cache.block_size not in PAGED_BLOCK_SIZES:
            raise ValueError(
                f"--block-size {cache.block_size} is not supported on the NPU: the paged "
                f"attention kernels take {list(PAGED_BLOCK_SIZES)}")

        # The backends pick 128 when the user sets no block size.
        block = cache.block_size if cache.user_specified_block_size else PAGED_BLOCK_SIZES[0]
        interleave = parallel.cp_kv_cache_interleave_size
        if parallel.decode_context_parallel_size > 1 and block % interleave:
            raise ValueError(
                f"--cp-kv-cache-interleave-size {interleave} does not divide the KV cache "
                f"block size {block}; with --decode-context-parallel-size "
                f"{parallel.decode_context_parallel_size} it must be one of "
                f"{[i for i in range(1, block + 1) if block % i == 0]}")

        model = vllm_config.model_config
        window = model.get_sliding_window() if model is not None else None
        if parallel.decode_context_parallel_size > 1 and window:
            raise ValueError(
                f"--decode-context-parallel-size {parallel.decode_context_parallel_size} "
                f"with sliding-window attention (window {window}) is not supported on the "
                "NPU platform; valid: 1")
        if model is not None and not SIMULATED:
            cls.check_if_supports_dtype(model.dtype)
        hf = getattr(model, "hf_config", None)
        if getattr(hf, "model_type", None) == "deepseek_v3" and \
                getattr(hf, "n_routed_experts", None) and \
                getattr(hf, "scoring_func", None) is None:
            # vLLM's deepseek_v2.py reads getattr(config, "scoring_func", "softmax");
            # DeepSeek-V3 itself scores with sigmoid (HF's DeepseekV3Config has no such key).
            logger.warning("vllm_npu: this DeepSeek-V3 config.json has no scoring_func: "
                           "vLLM will route with softmax, the model was trained with "
                           "sigmoid; add \"scoring_func\": \"sigmoid\" (and \"topk_method\": "
                           "\"noaux_tc\") to config.json")

    @classmethod
    def _check_moe_dispatch(cls, vllm_config: "VllmConfig", npu_config: NPUConfig) -> None:
        """all_to_all needs its split sizes on the host: it cannot run in a graph."""
        from vllm.config.compilation import CUDAGraphMode

        mode = vllm_config.compilation_config.cudagraph_mode
        if npu_config.moe.ep_dispatch == "all_to_all" and mode not in (None, CUDAGraphMode.NONE):
            raise ValueError(
                "additional-config moe.ep_dispatch='all_to_all' needs host-side token counts "
                f"and cannot run inside ACL graphs (cudagraph_mode {mode.name}); use 'auto' "
                "(all-to-all for eager batches, all-gather in graphs), 'all_gather', or "
                "--enforce-eager")

    @classmethod
    def _detect_modelslim(cls, vllm_config: "VllmConfig") -> None:
        """A ModelSlim checkpoint (quant_model_description.json) runs as `--quantization
        ascend` without the flag, as vllm-ascend detects it."""
        from vllm.config import VllmConfig

        from vllm_npu.quantization.modelslim import description_path

        model = vllm_config.model_config
        if model is None or model.quantization is not None \
                or description_path(model.model) is None:
            return
        logger.info("vllm_npu: %s holds a ModelSlim quant_model_description.json: "
                    "--quantization ascend", model.model)
        model.quantization = "ascend"
        vllm_config.quant_config = VllmConfig._get_quantization_config(
            model, vllm_config.load_config)

    @classmethod
    def _check_speculative(cls, vllm_config: "VllmConfig") -> None:
        """Methods the NPU runs, and the draft length its attention kernels take: FIA
        verifies at most 16 query tokens per request in a decode round (vllm-ascend
        attention/mla_v1.py, FIA_SEQ_LEN_LIMIT), i.e. 1 + at most 15 drafts."""
        spec = vllm_config.speculative_config
        if spec.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"--speculative-config method {spec.method!r} is not supported on the NPU "
                f"platform; valid: {list(SPECULATIVE_METHODS)} (deepseek_mtp is mtp)")
        dcp = vllm_config.parallel_config.decode_context_parallel_size
        if dcp > 1:
            raise ValueError(f"--speculative-config with --decode-context-parallel-size {dcp} "
                             "is not supported on the NPU platform; valid: 1")
        k = spec.num_speculative_tokens
        if k is None or not 1 <= k <= MAX_DRAFT_TOKENS:
            raise ValueError(
                f"--speculative-config num_speculative_tokens {k} is more than the NPU "
                f"attention kernels verify: valid 1..{MAX_DRAFT_TOKENS} (the fused attention "
                "op takes at most 16 query tokens per request in a decode round)")

    @classmethod
    def _check_prefill_context_parallel(cls, vllm_config: "VllmConfig") -> None:
        """PCP (the NPU runner's token slicing) runs without PP/DCP, eagerly (a graph
        would freeze one slicing of the batch)."""
        from vllm.config.compilation import CUDAGraphMode

        parallel = vllm_config.parallel_config
        pcp = parallel.prefill_context_parallel_size
        reasons = [why for bad, why in (
            (parallel.pipeline_parallel_size > 1, "pipeline parallelism"),
            (parallel.decode_context_parallel_size > 1, "decode context parallelism"),
            (vllm_config.speculative_config is not None, "speculative decoding"),
        ) if bad]
        if reasons:
            raise ValueError(f"--prefill-context-parallel-size {pcp} is not supported on the "
                             f"NPU platform together with {reasons}")
        compilation = vllm_config.compilation_config
        if compilation.cudagraph_mode not in (None, CUDAGraphMode.NONE):
            logger.info("vllm_npu: prefill context parallelism runs eagerly; "
                        "cudagraph_mode %s -> NONE", compilation.cudagraph_mode.name)
            compilation.cudagraph_mode = CUDAGraphMode.NONE

    @classmethod
    def apply_config_platform_defaults(cls, vllm_config: "VllmConfig") -> None:
        """NPU defaults for what the user left unset (vLLM fills the rest afterwards):
        decode batches replay full ACL graphs (host launch overhead dominates decode on
        Ascend) without torch.compile; a PIECEWISE mode turns on vLLM's compilation."""
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        compilation = vllm_config.compilation_config
        model = vllm_config.model_config
        # -O0 asks for no graphs and no compilation (vLLM's level defaults give NONE)
        unoptimized = getattr(vllm_config, "optimization_level", None) == 0
        if compilation.cudagraph_mode is None and not (model and model.enforce_eager) \
                and not unoptimized:
            compilation.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
        if compilation.mode is None:
            needs_compile = (compilation.cudagraph_mode is not None
                             and compilation.cudagraph_mode.requires_piecewise_compilation())
            compilation.mode = (CompilationMode.VLLM_COMPILE if needs_compile
                                else CompilationMode.NONE)
        if SIMULATED and compilation.mode == CompilationMode.VLLM_COMPILE:
            # No Inductor code generation on the simulated NPU: Dynamo splits the graph,
            # the pieces run eagerly inside ACL graph capture/replay.
            compilation.backend = "eager"
        # vLLM's fusion passes match CUDA kernels (and import only on CUDA/XPU): off here.
        passes = compilation.pass_config
        for name in dataclasses.fields(passes):
            if (name.name.startswith("fuse_") or name.name.endswith("_fusion")) \
                    and getattr(passes, name.name) is None:
                setattr(passes, name.name, False)
        custom_ops = compilation.custom_ops
        if "all" not in custom_ops and "none" not in custom_ops:
            npu_config = NPUConfig.from_additional_config(vllm_config.additional_config)
            # every mode, compiled ones too: the simulated ops are opaque custom ops for
            # Dynamo as torch_npu's are (ops/sim/opaque.py)
            custom_ops.append("all" if npu_config.enable_custom_ops else "none")

    @classmethod
    def update_block_size_for_backend(cls, vllm_config: "VllmConfig") -> None:
        super().update_block_size_for_backend(vllm_config)
        block = vllm_config.cache_config.block_size
        if block not in PAGED_BLOCK_SIZES:
            raise ValueError(f"KV cache block size {block} is not supported on the NPU; "
                             f"valid: {list(PAGED_BLOCK_SIZES)}")

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return True

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        return "vllm_npu.compilation.acl_graph.ACLGraphWrapper"

    @classmethod
    def graph_pool_handle(cls):
        from vllm_npu.compilation.graph_backend import get_graph_backend

        return get_graph_backend().graph_pool_handle()

    @classmethod
    def check_runner_kv_caches_multi_layer(cls) -> None:
        """Two attention layers with one layer index (a draft model's layer 0 beside the
        target's) are fine: the NPU runner uses its KV-cache list only as a set of
        tensors (block zeroing, sleep, resident-memory accounting), never by index."""

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        """vLLM's hybrid KV cache manager: sliding-window layers keep only their window's
        blocks, and Mamba / Gated DeltaNet state shares the pool with attention blocks
        (the attention backend addresses block-compact pages: kv_layout.paired_planes)."""
        return True

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return True

    @classmethod
    def use_custom_op_collectives(cls) -> bool:
        """TP collectives as vLLM's custom ops (`torch.ops.vllm.all_reduce` & co.): Dynamo
        records one call instead of tracing into the HCCL binding's ctypes calls."""
        return True
