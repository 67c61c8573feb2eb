"""The numpy placement of async scheduling's input ids against vLLM's own loop."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_npu.worker.async_input_ids import VectorisedAsyncInputIds


class _Ours(VectorisedAsyncInputIds, GPUModelRunner):
    def __init__(self) -> None:  # only the state _prepare_input_ids reads
        pass


def _state(runner, prev_positions, prev_tokens, spec=None, prompt_embeds=False):
    cpu = torch.device("cpu")
    runner.device = cpu
    runner.enable_prompt_embeds = prompt_embeds
    runner._pp_recv_work = None
    runner._draft_token_ids = None
    runner.prev_num_spec_tokens = 0
    runner.prev_positions = CpuGpuBuffer(64, dtype=torch.int64, device=cpu, pin_memory=False)
    runner.prev_positions.np[:len(prev_positions)] = prev_positions
    runner.input_ids = CpuGpuBuffer(512, dtype=torch.int32, device=cpu, pin_memory=False)
    runner.input_ids.np[:] = np.arange(512) + 1000  # the host's ids (prompt tokens)
    runner.input_ids.gpu.fill_(-7)  # last step's device contents
    runner.inputs_embeds = runner.is_token_ids = None
    runner.input_batch = types.SimpleNamespace(
        prev_sampled_token_ids=prev_tokens,
        req_ids=[f"r{i}" for i in range(len(prev_positions))])
    return types.SimpleNamespace(scheduled_spec_decode_tokens=spec or {})


CASES = {
    # prev positions (-1: new request), tokens scheduled per request
    "unchanged batch": ([0, 1, 2, 3, 4], [1, 1, 1, 1, 1]),
    "reordered": ([2, 0, 1, 4, 3], [1, 1, 1, 1, 1]),
    "a request finished": ([0, 1, 3, 4], [1, 1, 1, 1]),
    "new prefills between decodes": ([0, -1, 1, -1, 2], [1, 7, 1, 3, 1]),
    "new prefills only": ([-1, -1], [5, 9]),
    "decodes after a prefill chunk": ([-1, 3, 0], [16, 1, 1]),
}


@pytest.mark.parametrize("case", CASES)
def test_input_ids_equal_vllms_loop(case):
    prev_positions, counts = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    prev_tokens = torch.randint(0, 400, (6, 1), generator=g, dtype=torch.int32)
    cu = np.cumsum(counts, dtype=np.int32)
    total = int(cu[-1])
    results = []
    for method in (GPUModelRunner._prepare_input_ids, VectorisedAsyncInputIds._prepare_input_ids):
        runner = _Ours()
        out = _state(runner, prev_positions, prev_tokens)
        method(runner, out, len(counts), total, cu)
        results.append(runner.input_ids.gpu.clone())
    assert torch.equal(results[0], results[1])
    # and the property itself: each common request's token is the one it sampled
    for i, p in enumerate(prev_positions):
        if p >= 0:
            assert results[1][cu[i] - 1] == prev_tokens[p, 0]


@pytest.mark.parametrize("spec, embeds", [({"r1": [5, 6]}, False), ({}, True)])
def test_draft_tokens_and_prompt_embeds_take_vllms_path(spec, embeds, monkeypatch):
    calls = []
    monkeypatch.setattr(GPUModelRunner, "_prepare_input_ids",
                        lambda self, *args: calls.append(args))
    runner = _Ours()
    out = _state(runner, [0, 1], torch.zeros(2, 1, dtype=torch.int32), spec=spec,
                 prompt_embeds=embeds)
    runner._prepare_input_ids(out, 2, 2, np.array([1, 2], dtype=np.int32))
    assert len(calls) == 1
