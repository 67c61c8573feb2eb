"""The NPU's Ray executor pieces without a cluster (vllm_npu/distributed/ray_executor.py); the
engines over Ray are in tests/e2e/test_ray.py and test_ray_nodes.py."""
from __future__ import annotations

import pytest

pytest.importorskip("ray")

from vllm_npu.distributed import ray_executor as rx  # noqa: E402


def test_simulated_npus_follow_visible_devices(monkeypatch):
    monkeypatch.setenv("NPU_SIM_DEVICE_COUNT", "8")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    assert rx.simulated_npus() == 8
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "2,5,6")
    assert rx.simulated_npus() == 3  # Ray refuses more NPUs than are visible


def _nodes(*counts):
    return [{"Alive": True, "NodeManagerAddress": f"10.0.0.{i + 1}",
             "Resources": {"CPU": 4.0, **({"NPU": float(c)} if c else {})}}
            for i, c in enumerate(counts)] + [
        {"Alive": False, "NodeManagerAddress": "10.0.0.99", "Resources": {"NPU": 8.0}}]


def test_too_few_npus_names_the_numbers_and_the_fix(mocker):
    mocker.patch.object(rx.ray, "nodes", return_value=_nodes(2, 0))
    with pytest.raises(ValueError) as info:
        rx.check_enough_npus(4, "tensor 2 x pipeline 2 x prefill context 1")
    msg = str(info.value)
    assert "needs 4 NPUs (tensor 2 x pipeline 2 x prefill context 1)" in msg
    assert 'has 2: {"10.0.0.1": 2, "10.0.0.2": 0}' in msg  # the dead node does not count
    assert """ray start --head --resources '{"NPU": 8}'""" in msg
    mocker.patch.object(rx.ray, "nodes", return_value=_nodes(2, 2))
    rx.check_enough_npus(4, "tensor 2 x pipeline 2 x prefill context 1")  # enough: no error


def test_local_ray_gets_the_simulated_npus_and_an_existing_cluster_is_joined(
        mocker, monkeypatch, simulated):
    if not simulated:
        pytest.skip("a device's Ray counts its NPUs itself")
    monkeypatch.setenv("NPU_SIM_DEVICE_COUNT", "4")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    mocker.patch.object(rx.ray, "is_initialized", return_value=False)
    init = mocker.patch.object(rx.ray, "init")
    rx.connect_ray({"env_vars": {}})
    init.assert_called_once_with(runtime_env={"env_vars": {}}, resources={"NPU": 4})
    # a cluster already runs (RAY_ADDRESS or `ray start`): Ray refuses resources, join as is
    init.reset_mock()
    init.side_effect = [ValueError("When connecting to an existing cluster, resources must "
                                   "not be provided."), None]
    rx.connect_ray(None)
    assert init.call_args_list[1] == mocker.call(runtime_env=None)
    init.reset_mock()
    init.side_effect = ValueError("Invalid address format: x")
    with pytest.raises(ValueError, match="Invalid address"):
        rx.connect_ray(None)


class _Queue:
    def __init__(self, answers):
        self.answers = list(answers)
        self.shutting_down = False
        self.calls = []

    def dequeue(self, timeout=None):
        self.calls.append(timeout)
        answer = self.answers.pop(0)
        if answer is TimeoutError:
            raise TimeoutError
        return answer


class _Executor:
    is_failed = False


def test_response_wait_ends_when_the_executor_fails():
    executor = _Executor()
    queue = _Queue([TimeoutError, TimeoutError, "late"])
    wrapped = rx._FailFastQueue(queue, executor)
    assert wrapped.dequeue() == "late" and queue.calls == [1.0, 1.0, 1.0]
    assert wrapped.shutting_down is False  # the rest of the queue shows through

    executor.is_failed = True
    with pytest.raises(RuntimeError, match="a Ray worker of this engine died"):
        rx._FailFastQueue(_Queue([TimeoutError]), executor).dequeue()
    executor.is_failed = False
    stopped = _Queue([TimeoutError])
    stopped.shutting_down = True
    with pytest.raises(RuntimeError, match="died"):
        rx._FailFastQueue(stopped, executor).dequeue()


def test_response_wait_keeps_vllms_deadline():
    queue = _Queue([TimeoutError] * 10)
    with pytest.raises(TimeoutError):
        rx._FailFastQueue(queue, _Executor()).dequeue(timeout=0.0)
    assert queue.calls == [0.0]


def test_platform_puts_the_npu_executor_in_place_of_ray(tiny_models):
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=tiny_models["llama"], tensor_parallel_size=2,
                        distributed_executor_backend="ray").create_engine_config()
    parallel = config.parallel_config
    assert parallel.distributed_executor_backend is rx.NPURayExecutor
    assert parallel.use_ray


def test_data_parallel_over_ray_refuses_too_few_npus_at_config(tiny_models, mocker):
    """DP over Ray: the platform connects Ray while the config is made (vLLM's DP manager
    would ray.init() bare next) and counts every DP rank's NPUs."""
    from vllm.engine.arg_utils import EngineArgs

    connect = mocker.patch.object(rx, "connect_ray")
    mocker.patch.object(rx.ray, "nodes", return_value=_nodes(2, 1))
    args = EngineArgs(model=tiny_models["llama"], tensor_parallel_size=2,
                      data_parallel_size=2, data_parallel_backend="ray")
    with pytest.raises(ValueError, match=r"needs 4 NPUs \(data parallel 2 x tensor 2 x "
                                         r"pipeline 1 x prefill context 1\) but the Ray "
                                         r"cluster has 3"):
        args.create_engine_config()
    connect.assert_called_once_with()
