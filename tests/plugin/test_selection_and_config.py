"""Backend selection, plugin activation, env vars and --additional-config validation."""
from __future__ import annotations

import sys

import pytest

import vllm_npu
from vllm_npu import device, envs
from vllm_npu.config import NPUConfig


@pytest.fixture
def fresh_selection():
    device.select_backend.cache_clear()
    yield
    device.select_backend.cache_clear()


def test_register_returns_the_platform_class_path(monkeypatch):
    monkeypatch.delenv("NPU_PLUGIN_DISABLE", raising=False)
    assert vllm_npu.register() == "vllm_npu.platform.NPUPlatform"


def test_disable_env_turns_the_plugin_off(monkeypatch):
    monkeypatch.setenv("NPU_PLUGIN_DISABLE", "1")
    assert vllm_npu.register() is None


def test_plugin_stays_out_when_another_accelerator_is_present(monkeypatch):
    from vllm.platforms import builtin_platform_plugins

    monkeypatch.setitem(builtin_platform_plugins, "cuda",
                        lambda: "vllm.platforms.cuda.CudaPlatform")
    assert device.other_accelerator() == "cuda"
    assert vllm_npu.register() is None


def test_no_torch_npu_means_simulated_with_reason(monkeypatch, fresh_selection):
    monkeypatch.delenv("NPU_PLUGIN_SIMULATE", raising=False)
    monkeypatch.setattr(device.importlib.util, "find_spec", lambda name: None)
    backend = device.select_backend()
    assert backend.simulated and backend.reason == "torch_npu not installed"


def test_torch_npu_without_cann_means_simulated_with_reason(monkeypatch, fresh_selection):
    monkeypatch.delenv("NPU_PLUGIN_SIMULATE", raising=False)
    monkeypatch.setattr(device.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import raises ImportError
    backend = device.select_backend()
    assert backend.simulated
    assert backend.reason.startswith("torch_npu not importable:")


def test_simulate_env_forces_the_simulator(monkeypatch, fresh_selection):
    monkeypatch.setenv("NPU_PLUGIN_SIMULATE", "yes")
    backend = device.select_backend()
    assert backend.simulated and backend.reason == "NPU_PLUGIN_SIMULATE=1"
    assert backend.name == "simulated NPU"


@pytest.mark.parametrize("var,raw,message", [
    (envs.NPU_PLUGIN_DISABLE, "maybe", "NPU_PLUGIN_DISABLE='maybe' is not a boolean"),
    (envs.NPU_SIM_MEMORY_GB, "-2", "NPU_SIM_MEMORY_GB='-2' must be > 0"),
    (envs.NPU_SIM_MEMORY_GB, "lots", "NPU_SIM_MEMORY_GB='lots' is not a number"),
    (envs.NPU_SIM_DEVICE_COUNT, "0", "NPU_SIM_DEVICE_COUNT='0' must be > 0"),
])
def test_bad_env_values_name_the_variable(monkeypatch, var, raw, message):
    monkeypatch.setenv(var.name, raw)
    with pytest.raises(ValueError, match=message):
        var.get()


def test_env_values_parse(monkeypatch):
    monkeypatch.setenv("NPU_SIM_MEMORY_GB", "1.5")
    monkeypatch.setenv("NPU_PLUGIN_SIMULATE", "off")
    assert envs.NPU_SIM_MEMORY_GB.get() == 1.5
    assert envs.NPU_PLUGIN_SIMULATE.get() is False
    assert all(not v.name.startswith("VLLM_") for v in envs.ALL)


def test_additional_config_defaults_and_values():
    assert NPUConfig.from_additional_config(None) == NPUConfig()
    cfg = NPUConfig.from_additional_config({"decode_attention_op": "fused_infer_attention",
                                            "enable_custom_ops": False})
    assert cfg.decode_attention_op == "fused_infer_attention"
    assert cfg.enable_custom_ops is False


def test_unknown_additional_config_key_lists_valid_keys():
    with pytest.raises(ValueError) as e:
        NPUConfig.from_additional_config({"graph_mode": True})
    msg = str(e.value)
    assert "['graph_mode']" in msg
    assert "decode_attention_op" in msg and "enable_custom_ops" in msg


def test_bad_additional_config_value_names_key_and_choices():
    with pytest.raises(ValueError) as e:
        NPUConfig.from_additional_config({"decode_attention_op": "flash"})
    msg = str(e.value)
    assert "decode_attention_op='flash'" in msg
    assert "'paged_attention'" in msg and "'fused_infer_attention'" in msg
    with pytest.raises(ValueError, match="enable_custom_ops='often'"):
        NPUConfig.from_additional_config({"enable_custom_ops": "often"})


def test_the_platform_and_its_default_config_leave_the_eplb_solvers_unimported():
    """Every vLLM process loads the platform (engine core, each worker, the API server);
    the EPLB policies' modules (numba, scipy's MILP: ~0.6 s) load only where EPLB runs."""
    import subprocess

    code = ("import sys; import vllm_npu.platform; from vllm_npu.config import NPUConfig; "
            "NPUConfig.from_additional_config({'eplb': {'policy': 'lookahead'}}); "
            "print(sorted(m for m in ('numba', 'vllm_npu.eplb.policy.exact', "
            "'vllm_npu.eplb.policy.packing') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
