"""A pause in vLLM's KV-transfer polling loop.

With a KV connector, vLLM 0.33's engine keeps stepping while any request waits on a
transfer: a prefill instance's finished requests until the decode side has pulled their
blocks (or VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, 480 s, has passed), a decode instance's
requests until their KV has arrived (`Scheduler.has_requests`, v1/core/sched/scheduler.py).
Each step with nothing to run is an `execute_model` whose only work is the connector's
`get_finished` (`kv_connector_no_forward`), and nothing in the loop waits: the engine core
and every worker of the instance spin at a full core each. Measured on this 2-core host: a
prefill instance (TP=2) holding the blocks of a killed decode instance's requests took
1.6 cores for minutes, and the decode instance started again beside it needed 159 s to
come up (21 s on an idle host).

The worker pauses `NPU_KV_IDLE_POLL_MS` (5 ms) after such a step when it found nothing
finished, so a transfer's completion is seen at most that much later, and a step with
tokens to run, or whose poll found a transfer done, is never delayed.
"""
from __future__ import annotations

import time

from vllm.distributed.kv_transfer import has_kv_transfer_group
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

from vllm_npu import envs


def pause_if_only_polling(scheduler_output, output) -> bool:
    """Sleep if this step ran no tokens and its transfer poll came back empty (vLLM returns
    EMPTY_MODEL_RUNNER_OUTPUT itself then); return whether it paused."""
    if (scheduler_output is None or scheduler_output.total_num_scheduled_tokens
            or output is not EMPTY_MODEL_RUNNER_OUTPUT or not has_kv_transfer_group()):
        return False
    pause_ms = envs.NPU_KV_IDLE_POLL_MS.get()
    if pause_ms > 0:
        time.sleep(pause_ms / 1000)
    return pause_ms > 0
