"""NPUPlatform's surface as vLLM sees it (on the simulated NPU here)."""
from __future__ import annotations

import argparse

import pytest
import torch

from vllm_npu import platform as npu_platform
from vllm_npu.platform import NPUPlatform

GiB = 1 << 30


def test_vllm_resolves_to_the_npu_platform(simulated):
    from vllm.platforms import current_platform

    assert isinstance(current_platform, NPUPlatform)
    assert current_platform.is_out_of_tree()
    assert NPUPlatform.ray_device_key == "NPU"
    assert NPUPlatform.device_control_env_var == "ASCEND_RT_VISIBLE_DEVICES"
    if simulated:
        # vLLM builds torch.device(f"{device_name}:{i}"): it must be a real torch type here.
        assert (NPUPlatform.device_name, NPUPlatform.device_type) == ("cpu", "cpu")
        assert (NPUPlatform.dispatch_key, NPUPlatform.dist_backend) == ("CPU", "gloo")
        assert NPUPlatform.get_device_name() == "Ascend NPU (simulated)"
        assert NPUPlatform.is_pin_memory_available() is False
    else:
        assert (NPUPlatform.device_name, NPUPlatform.dist_backend) == ("npu", "hccl")


def test_simulated_memory_capacity_follows_env(monkeypatch, simulated):
    if not simulated:
        pytest.skip("capacity of a real NPU comes from the device")
    monkeypatch.setenv("NPU_SIM_MEMORY_GB", "2.5")
    assert NPUPlatform.get_device_total_memory(0) == int(2.5 * GiB)
    monkeypatch.delenv("NPU_SIM_MEMORY_GB")
    assert NPUPlatform.get_device_total_memory(0) == 4 * GiB


def test_manual_seed_all_is_reproducible():
    NPUPlatform.manual_seed_all(7)
    a = torch.rand(4)
    NPUPlatform.manual_seed_all(7)
    assert torch.equal(a, torch.rand(4))


def test_device_flag_accepts_npu_and_refuses_others(capsys):
    parser = argparse.ArgumentParser(prog="vllm serve")
    NPUPlatform.pre_register_and_update(parser)
    NPUPlatform.pre_register_and_update(parser)  # idempotent: no duplicate option
    assert parser.parse_args(["--device", "npu"]).device == "npu"
    with pytest.raises(SystemExit):
        parser.parse_args(["--device", "cuda"])
    err = capsys.readouterr().err
    assert "--device 'cuda' is not available" in err and "only --device npu" in err


def test_float32_is_refused_on_a_real_device_only(monkeypatch):
    monkeypatch.setattr(npu_platform, "SIMULATED", True)
    NPUPlatform.check_if_supports_dtype(torch.float32)  # simulation-only extension
    monkeypatch.setattr(npu_platform, "SIMULATED", False)
    NPUPlatform.check_if_supports_dtype(torch.bfloat16)
    with pytest.raises(ValueError, match="float32 models are not supported on Ascend NPUs"):
        NPUPlatform.check_if_supports_dtype(torch.float32)


def test_attention_backend_choice():
    from types import SimpleNamespace

    from vllm.v1.attention.selector import AttentionSelectorConfig

    path = NPUPlatform.get_attn_backend_cls(None, SimpleNamespace(use_mla=False))
    assert path == "vllm_npu.attention.backend.NPUAttentionBackend"
    mla = AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto",
                                  block_size=128, use_mla=True)
    assert NPUPlatform.get_attn_backend_cls(None, mla) == "vllm_npu.attention.mla.NPUMLABackend"
    with pytest.raises(ValueError, match="FLASH_ATTN is not available on the NPU platform"):
        NPUPlatform.get_attn_backend_cls(SimpleNamespace(name="FLASH_ATTN"),
                                         SimpleNamespace(use_mla=False))


def _engine_config(model: str, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=model, max_model_len=512, **kwargs).create_engine_config()


def test_engine_config_gets_npu_defaults(tiny_models):
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode

    cfg = _engine_config(tiny_models["llama"], max_num_seqs=8)
    assert cfg.parallel_config.worker_cls == "vllm_npu.worker.worker.NPUWorker"
    assert cfg.scheduler_config.async_scheduling is True  # vLLM's default, kept on the NPU
    # Decode replays full ACL graphs, without torch.compile; sizes bounded by max_num_seqs.
    assert cfg.compilation_config.mode == CompilationMode.NONE
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert cfg.compilation_config.cudagraph_capture_sizes == [1, 2, 4, 8, 16]
    assert "all" in cfg.compilation_config.custom_ops


@pytest.mark.parametrize("mode,compile_mode,wants_compile", [
    ("NONE", "NONE", False), ("FULL", "NONE", False), ("FULL_DECODE_ONLY", "NONE", False),
    ("PIECEWISE", "VLLM_COMPILE", True), ("FULL_AND_PIECEWISE", "VLLM_COMPILE", True)])
def test_graph_modes_map_to_compilation(tiny_models, simulated, mode, compile_mode,
                                        wants_compile):
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode

    cc = _engine_config(tiny_models["llama"],
                        compilation_config={"cudagraph_mode": mode}).compilation_config
    assert cc.cudagraph_mode == CUDAGraphMode[mode]
    assert cc.mode == CompilationMode[compile_mode]
    if wants_compile and simulated:
        assert cc.backend == "eager"
    assert cc.custom_ops == ["all"]  # the NPU layers in every mode (ops/sim/opaque.py)


def test_enforce_eager_disables_graphs(tiny_models):
    from vllm.config.compilation import CUDAGraphMode

    cc = _engine_config(tiny_models["llama"], enforce_eager=True).compilation_config
    assert cc.cudagraph_mode == CUDAGraphMode.NONE


def test_unsupported_block_size_fails_at_startup(tiny_models):
    with pytest.raises(ValueError, match=r"--block-size 16 is not supported on the NPU.*128"):
        _engine_config(tiny_models["llama"], block_size=16)


def test_bad_additional_config_fails_engine_config(tiny_models):
    with pytest.raises(ValueError, match=r"Unknown --additional-config key\(s\) \['nope'\]"):
        _engine_config(tiny_models["llama"], additional_config={"nope": 1})


def test_world_size_larger_than_the_npus_fails_at_startup(tiny_models, monkeypatch, simulated):
    if not simulated:
        pytest.skip("device count of a real host")
    monkeypatch.setenv("NPU_SIM_DEVICE_COUNT", "1")
    assert NPUPlatform.device_count() == 1
    with pytest.raises(ValueError, match=r"World size 2 .* exceeds the 1 NPUs on this node"):
        _engine_config(tiny_models["llama"], tensor_parallel_size=2)


def test_routed_experts_output_is_refused_at_startup(tmp_path):
    # vLLM leaves this check to out-of-tree platforms; the V1 runner would drop the output.
    from vllm_npu.testing.tiny_model import build_tiny_model

    moe = build_tiny_model(str(tmp_path / "moe"), arch="qwen3_moe")
    with pytest.raises(ValueError, match=r"--enable-return-routed-experts is not supported "
                                         r"on the NPU.*Model Runner V2"):
        _engine_config(moe, enable_return_routed_experts=True)


def test_optimization_level_0_captures_no_graphs(tiny_models):
    # -O0 is vLLM's "start up immediately": no graphs, no compilation, on the NPU too
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode

    cc = _engine_config(tiny_models["llama"], optimization_level=0).compilation_config
    assert (cc.cudagraph_mode, cc.mode) == (CUDAGraphMode.NONE, CompilationMode.NONE)
    default = _engine_config(tiny_models["llama"]).compilation_config
    assert default.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY


def test_an_unsupported_quantization_names_each_valid_method_once():
    import vllm_npu.quantization.modelslim  # noqa: F401  registers "ascend" (vLLM appends it)

    with pytest.raises(ValueError) as err:
        NPUPlatform.verify_quantization("mxfp8")
    message = str(err.value)
    assert message.startswith("mxfp8 quantization is not supported on the NPU platform yet")
    listed = message.split("(supported: ", 1)[1].split(")", 1)[0]
    assert listed.count("'ascend'") == 1 and "'compressed-tensors'" in listed
