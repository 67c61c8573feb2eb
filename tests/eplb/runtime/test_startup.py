"""vLLM's EPLB flags on the NPU: accepted, validated for the model and the EP size at
startup, handed to the plugin's runtime (vLLM's own EPLB switched off)."""
from __future__ import annotations

import pytest

import vllm_npu.config as npu_config


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory) -> str:
    from vllm_npu.testing.tiny_model import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("eplb_cfg") / "m"), arch="qwen3_moe")


@pytest.fixture(autouse=True)
def _keep_plugin_config():
    saved = npu_config._current
    yield
    npu_config._current = saved


def _engine_config(path: str, tp: int = 2, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=path, enable_expert_parallel=True, enable_eplb=True,
                      tensor_parallel_size=tp, **kwargs).create_engine_config()


def test_vllm_flags_reach_the_npu_runtime(moe_path):
    cfg = _engine_config(moe_path, eplb_config={"num_redundant_experts": 2, "window_size": 5,
                                                "step_interval": 7, "log_balancedness": True},
                         additional_config={"eplb": {"policy": "swift"}})
    assert cfg.additional_config["eplb"] == {
        "policy": "swift", "enabled": True, "num_redundant_experts": 2, "window_size": 5,
        "step_interval": 7, "log_balancedness": True, "log_balancedness_interval": 1}
    options = npu_config.get_npu_config().eplb
    assert options.enabled and options.policy == "swift" and options.num_redundant_experts == 2
    assert not cfg.parallel_config.enable_eplb  # vLLM's EplbState stays off
    assert cfg.parallel_config.eplb_config.num_redundant_experts == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(eplb_config={"num_redundant_experts": 1}),
     "8 experts \\+ 1 redundant = 9 physical experts do not split over 2 expert-parallel "
     "ranks; valid values include \\[0, 2, 4\\]"),
    (dict(eplb_config={"num_redundant_experts": 10}),
     "would hold 9 slots but the model has only 8 experts"),
    (dict(pipeline_parallel_size=2), "--enable-eplb with --pipeline-parallel-size 2"),
    (dict(additional_config={"eplb": {"policy": "greedy"}}), "eplb.policy='greedy'"),
    (dict(additional_config={"eplb": {"policy": "lookahead", "policy_options": {"budget": 1}}}),
     "unknown option\\(s\\) \\['budget'\\] for EPLB policy 'lookahead'; valid: .*'move_budget'"),
])
def test_bad_eplb_setups_stop_at_startup(moe_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _engine_config(moe_path, **kwargs)


def test_dense_model_refused(tmp_path):
    from vllm_npu.testing.tiny_model import build_tiny_model

    path = build_tiny_model(str(tmp_path / "dense"), arch="llama")
    # vLLM refuses expert parallelism on a dense model before EPLB is looked at
    with pytest.raises(ValueError, match="Number of experts in the model must be greater"):
        _engine_config(path)
