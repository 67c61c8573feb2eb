"""vLLM's Ray executor on the NPU, with three differences that users starting Ray the usual ways
need (vLLM 0.33's RayExecutorV2 otherwise unchanged):

- **No cluster started.** vLLM calls ``ray.init()``, which starts a local Ray when none runs.
  Ray counts a node's NPUs itself (``ray/_private/accelerators/npu.py``: AscendCL's
  ``acl.rt.get_device_count()``, else the ``/dev/davinci<N>`` files, capped by
  ``ASCEND_RT_VISIBLE_DEVICES``), which finds none on the simulated NPU: the placement group
  then waited out vLLM's 1800 s. Here a local Ray started on the simulated NPU advertises
  ``NPU_SIM_DEVICE_COUNT`` NPUs (Ray's ``resources=`` for a node it starts). On a device
  Ray's own count stands.
- **Too few NPUs fails in seconds** with the numbers and the ``ray start --resources`` fix,
  instead of vLLM's warning followed by the placement-group wait.
- **A lost node fails the step, not the client's patience.** vLLM's worker monitor logs a
  dead worker and shuts the executor down at once, but a step waiting on a worker of another
  node waits in a ZMQ poll that shutdown does not wake (``MessageQueue.dequeue``'s remote
  reader path), for VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS. Here the wait is cut in slices that
  look at the executor's state, so the step fails within a second of the monitor's verdict.

vLLM takes an Executor subclass as ``distributed_executor_backend`` (``uses_ray`` keeps its
Ray-specific checks on); the platform puts this class in place of ``"ray"``.
"""
from __future__ import annotations

import json
import logging
import os
import time

import ray
from vllm.v1.executor.ray_executor_v2 import RayExecutorV2

from vllm_npu import envs
from vllm_npu.device import select_backend

logger = logging.getLogger("vllm.npu")  # under "vllm": uses vLLM's log handlers

RESOURCE = "NPU"  # the platform's ray_device_key; Ray's NPUAcceleratorManager resource name
VISIBLE_ENV = "ASCEND_RT_VISIBLE_DEVICES"


def simulated_npus() -> int:
    """The NPUs a Ray node started on the simulated NPU advertises: NPU_SIM_DEVICE_COUNT, capped
    by ASCEND_RT_VISIBLE_DEVICES as Ray caps a detected count (it refuses more)."""
    count = envs.NPU_SIM_DEVICE_COUNT.get()
    visible = os.environ.get(VISIBLE_ENV)
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def connect_ray(runtime_env=None) -> None:
    """``ray.init()`` as vLLM calls it (RAY_ADDRESS, else the cluster ``ray start`` left on this
    host, else a new local Ray), with the simulated NPUs as the ``NPU`` resource when it is a
    new local Ray on the simulator. Ray refuses resources for a cluster it joins, before it
    connects (ray/_private/worker.py ``init``), so that refusal means: join as it is."""
    if ray.is_initialized():
        return
    if not select_backend().simulated:
        ray.init(runtime_env=runtime_env)
        return
    npus = simulated_npus()
    # Ray asks AscendCL for the chip name of a node with NPUs and logs a traceback when it is
    # absent, as it always is on the simulator.
    chip_probe = logging.getLogger("ray._private.accelerators.npu")
    level = chip_probe.level
    chip_probe.setLevel(logging.CRITICAL)
    try:
        ray.init(runtime_env=runtime_env, resources={RESOURCE: npus})
    except ValueError as exc:
        if "must not be provided" not in str(exc):
            raise
        ray.init(runtime_env=runtime_env)
        return
    finally:
        chip_probe.setLevel(level)
    logger.info("vllm_npu: started a local Ray whose node has %d simulated NPUs "
                "(NPU_SIM_DEVICE_COUNT)", npus)


def npus_per_node() -> dict[str, int]:
    """NPU resource of each alive node, keyed by the node's address."""
    found = {}
    for node in ray.nodes():
        if node.get("Alive"):
            found[node.get("NodeManagerAddress", "?")] = \
                int(node.get("Resources", {}).get(RESOURCE, 0))
    return found


def check_enough_npus(world_size: int, sizes: str) -> None:
    """Refuse, within seconds, a Ray cluster with fewer NPUs than the workers need."""
    per_node = npus_per_node()
    total = sum(per_node.values())
    if total >= world_size:
        return
    device_note = (
        "the simulated NPU's local Ray advertises NPU_SIM_DEVICE_COUNT; a cluster started "
        "with `ray start` advertises only the NPUs given to it"
        if select_backend().simulated else
        "Ray counts a node's NPUs through AscendCL or /dev/davinci*, capped by "
        "ASCEND_RT_VISIBLE_DEVICES")
    raise ValueError(
        f"The Ray executor needs {world_size} NPUs ({sizes}) but the Ray cluster has "
        f"{total}: {json.dumps(per_node)} (NPUs per node). Start every node's Ray with its "
        f"NPUs, e.g. `ray start --head --resources '{{\"{RESOURCE}\": 8}}'` on the head and "
        f"`ray start --address <head-ip>:6379 --resources '{{\"{RESOURCE}\": 8}}'` on the "
        f"others, or lower the parallel sizes ({device_note}).")


class _FailFastQueue:
    """A worker response queue whose wait ends when the executor has failed or shut down."""

    SLICE_S = 1.0

    def __init__(self, queue, executor: "NPURayExecutor"):
        self._queue = queue
        self._executor = executor

    def __getattr__(self, name):
        return getattr(self._queue, name)

    def dequeue(self, timeout: float | None = None, **kwargs):
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            step = self.SLICE_S if end is None else \
                min(self.SLICE_S, max(0.0, end - time.monotonic()))
            try:
                return self._queue.dequeue(timeout=step, **kwargs)
            except TimeoutError:
                if self._executor.is_failed or getattr(self._queue, "shutting_down", False):
                    raise RuntimeError(
                        "a Ray worker of this engine died (see the RayWorkerMonitor error "
                        "above: its node or process was lost); the running requests fail"
                    ) from None
                if end is not None and time.monotonic() >= end:
                    raise


class NPURayExecutor(RayExecutorV2):
    """RayExecutorV2 that connects Ray itself first (see the module docstring)."""

    def _init_executor(self) -> None:
        parallel = self.parallel_config
        connect_ray(parallel.ray_runtime_env)
        if parallel.placement_group is None and ray.util.get_current_placement_group() is None:
            sizes = (f"tensor {parallel.tensor_parallel_size} x pipeline "
                     f"{parallel.pipeline_parallel_size} x prefill context "
                     f"{parallel.prefill_context_parallel_size}")
            check_enough_npus(parallel.world_size, sizes)
        super()._init_executor()
        self.response_mqs = [_FailFastQueue(q, self) for q in self.response_mqs]
