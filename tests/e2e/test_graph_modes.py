"""ACL graph modes end to end: identical greedy tokens in every mode while batch
composition and sequence lengths change every step, graphs really replayed, and a
simulator strict enough that skipping the attention parameter update breaks FULL replay."""
from __future__ import annotations

import pytest

from tests.helpers.engine import make_llm, shutdown, vocab
from tests.helpers.reference import hf_greedy, random_prompt
from vllm_npu.compilation.acl_graph import ACLGraphWrapper
from vllm_npu.compilation.graph_params import GRAPH_PARAMS

FULL_MODES = ("FULL_DECODE_ONLY", "FULL", "FULL_AND_PIECEWISE")


def _workload(path: str):
    """Requests of different lengths finishing at different steps: every step's batch
    (prefill chunks, decodes, their count and lengths) differs from the last."""
    prompts = [random_prompt(500 + i, 5 + 29 * i, vocab(path)) for i in range(7)]
    max_tokens = [6 + 5 * i for i in range(7)]
    return prompts, max_tokens


def _generate(llm, prompts, max_tokens):
    from vllm import SamplingParams

    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in max_tokens]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _run(path, dtype, **kwargs):
    llm = make_llm(path, dtype, enable_sleep_mode=False, **kwargs)
    try:
        stats0 = (ACLGraphWrapper.stats.replays, GRAPH_PARAMS.updates)
        got = _generate(llm, *_workload(path))
        replays = ACLGraphWrapper.stats.replays - stats0[0]
        updates = GRAPH_PARAMS.updates - stats0[1]
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        mode = runner.compilation_config.cudagraph_mode
        return got, replays, updates, runner, mode
    finally:
        shutdown(llm)


@pytest.fixture(scope="module")
def expected(tiny_models):
    path = tiny_models["llama"]
    prompts, max_tokens = _workload(path)
    return [hf_greedy(path, p, n) for p, n in zip(prompts, max_tokens)]


def _spy_sim_kernels(mocker) -> dict:
    """Spies on the simulated NPU layers' kernels (npu_rms_norm / npu_add_rms_norm,
    npu_rotary_mul, npu_swiglu, float32): they run only when a forward runs the NPU
    layers (eager, a graph capture, an eager batch), never while Dynamo traces them (it
    records the ops' fakes), and spying on them leaves the traced code unchanged."""
    from vllm.model_executor.layers import rotary_embedding

    from vllm_npu.ops.sim import native

    # vLLM caches rotary embeddings by shape across engines in a process, each holding the
    # forward it picked when built
    mocker.patch.dict(rotary_embedding._ROPE_DICT, clear=True)
    return {name: mocker.spy(native, name) for name in ("rms_norm", "rotary_mul", "swiglu")}


@pytest.mark.parametrize("mode", ["eager", "PIECEWISE", *FULL_MODES])
def test_every_graph_mode_gives_hf_tokens(tiny_models, parity_dtype, expected, mode, mocker):
    from vllm_npu.ops.sim.linear import ONEDNN_MIN_ROWS

    path = tiny_models["llama"]
    kwargs = ({"enforce_eager": True} if mode == "eager"
              else {"compilation_config": {"cudagraph_mode": mode}})
    if "PIECEWISE" in mode:
        # vLLM's default max_num_batched_tokens: Dynamo traces the pieces for a batch large
        # enough that the simulated matmul picks its prefill kernel, a host-side choice it
        # must not see (the op is opaque: ops/sim/opaque.py)
        kwargs["max_num_batched_tokens"] = None
    kernels = _spy_sim_kernels(mocker)
    got, replays, updates, runner, resolved = _run(path, parity_dtype, **kwargs)
    assert got == expected
    if "PIECEWISE" in mode:
        assert runner.scheduler_config.max_num_batched_tokens >= ONEDNN_MIN_ROWS
    calls = {name: spy.call_count for name, spy in kernels.items()}
    # The NPU layers (npu_rms_norm / npu_add_rms_norm, npu_rotary_mul, npu_swiglu) carry
    # the model in every mode: the piecewise modes compile with Dynamo, which records the
    # simulated ops as opaque custom ops (ops/sim/opaque.py), as it does torch_npu's.
    assert all(calls.values()), calls
    if mode == "eager":
        assert replays == 0
        return
    assert resolved.name == mode
    assert replays > 0  # graphs were replayed, not bypassed
    assert (updates > 0) == (mode in FULL_MODES)  # FULL replays refresh attention tasks


def test_skipping_the_update_hook_refuses_full_replay(tiny_models, parity_dtype,
                                                      monkeypatch):
    """Proof of strictness: without the hook a replayed task still points at the capture's
    arguments; with int32 slots made fresh each step (the builder normally writes them into
    one mirror buffer), the capture batch's slot mapping was freed after the capture (a
    device would scatter the new K/V through whatever memory took its place): refused."""
    import torch

    from vllm_npu.attention.backend import NPUAttentionImpl, NPUAttentionMetadataBuilder
    from vllm_npu.ops.sim.checks import NPUOpError

    monkeypatch.setattr(NPUAttentionImpl, "update_graph_params", lambda *a, **k: None)
    monkeypatch.setattr(NPUAttentionMetadataBuilder, "_int32_slots",
                        lambda self, slots: slots.to(torch.int32))
    with pytest.raises(NPUOpError, match=r"task _npu_reshape_and_cache points at a freed "
                                         r"torch.int32 tensor"):
        _run(tiny_models["llama"], parity_dtype)  # FULL_DECODE_ONLY


def test_cache_write_task_reissued_only_when_its_slots_moved(tiny_models, parity_dtype,
                                                             expected, mocker, monkeypatch):
    """The builder's int32 slots sit where the captured cache-write task reads them: FULL
    replays re-issue the attention task only (as vllm-ascend does), and the tokens match.
    With slots made fresh each step, every replay re-issues the cache write too."""
    import torch

    from vllm_npu.attention.backend import NPUAttentionImpl, NPUAttentionMetadataBuilder

    writes = mocker.spy(NPUAttentionImpl, "_write_cache")
    got, replays, updates, _, _ = _run(tiny_models["llama"], parity_dtype)
    assert got == expected and replays > 0 and updates > 0
    in_updates = writes.call_count
    monkeypatch.setattr(NPUAttentionMetadataBuilder, "_int32_slots",
                        lambda self, slots: slots.to(torch.int32))
    got, replays, updates, _, _ = _run(tiny_models["llama"], parity_dtype)
    assert got == expected
    # each layer's update re-issues its cache write now (llama: 2 layers, one per update)
    assert writes.call_count - in_updates >= in_updates + updates


def test_attention_task_replays_its_captured_lengths_without_an_update(
        tiny_models, parity_dtype, expected, monkeypatch):
    """The hook re-issues the KV-cache write but not the attention task: the attention
    replays the sequence lengths it was captured with (host arguments are frozen into a
    task, as on a device), even though vLLM rewrote its host seq-lens buffer in place."""
    from vllm_npu.attention.backend import NPUAttentionImpl

    def cache_write_only(self, backend, stream, tasks, meta):
        if tasks.cache_write is not None:
            backend.task_update_begin(stream, tasks.cache_write)
            self._write_cache(tasks.key, tasks.value, tasks.kv_cache, meta)
            backend.task_update_end(stream)

    monkeypatch.setattr(NPUAttentionImpl, "update_graph_params", cache_write_only)
    got, replays, _, _, _ = _run(tiny_models["llama"], parity_dtype)  # FULL_DECODE_ONLY
    assert replays > 0
    assert got != expected


def test_backend_without_the_hook_never_gets_full_graphs(tiny_models, parity_dtype,
                                                         expected, monkeypatch):
    from vllm.distributed import cleanup_dist_env_and_memory
    from vllm.v1.attention.backend import AttentionCGSupport

    from vllm_npu.attention.backend import NPUAttentionImpl, NPUAttentionMetadataBuilder

    path = tiny_models["llama"]
    monkeypatch.delattr(NPUAttentionImpl, "update_graph_params")
    assert NPUAttentionMetadataBuilder.get_cudagraph_support(None, None) \
        == AttentionCGSupport.NEVER
    # Asked for explicitly: refused at start-up, naming the backend.
    with pytest.raises(ValueError, match="FULL is not supported with NPUAttentionBackend"):
        try:
            make_llm(path, parity_dtype, enable_sleep_mode=False,
                     compilation_config={"cudagraph_mode": "FULL"})
        finally:
            cleanup_dist_env_and_memory()
    # By default (FULL_DECODE_ONLY): downgraded to no full graphs, still exact.
    got, replays, updates, _, mode = _run(path, parity_dtype)
    assert not mode.has_full_cudagraphs() and updates == 0
    assert got == expected


def test_dispatch_picks_the_smallest_captured_size(tiny_models, parity_dtype):
    from vllm.config import CUDAGraphMode

    llm = make_llm(tiny_models["llama"], parity_dtype, enable_sleep_mode=False)
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        sizes = runner.compilation_config.cudagraph_capture_sizes
        assert sizes == [1, 2, 4, 8, 16, 24, 32]  # vLLM's ladder up to 2 x max_num_seqs
        # Decode graphs exist up to max_num_seqs=16 requests.
        for n, want in ((1, 1), (3, 4), (5, 8), (9, 16), (16, 16)):
            mode, desc = runner.cudagraph_dispatcher.dispatch(n, uniform_decode=True)
            assert (mode, desc.num_tokens) == (CUDAGraphMode.FULL, want)
        mode, _ = runner.cudagraph_dispatcher.dispatch(17, uniform_decode=True)
        assert mode == CUDAGraphMode.NONE  # larger than every decode graph: eager
        assert all(runner.model.has_graph(d) for d in runner.model.entries)
    finally:
        shutdown(llm)


# ------------------------------------------------------------------------------- MLA


@pytest.fixture(scope="module")
def mla_path(tmp_path_factory):
    from vllm_npu.testing.tiny_model import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("mla-graph") / "mla"),
                            arch="deepseek_v3")


@pytest.fixture(scope="module")
def mla_expected(mla_path):
    prompts, max_tokens = _workload(mla_path)
    return [hf_greedy(mla_path, p, n) for p, n in zip(prompts, max_tokens)]


def test_mla_decode_graphs_give_hf_tokens(mla_path, parity_dtype, mla_expected):
    """MLA replays FULL graphs for pure-decode batches (the default FULL_DECODE_ONLY):
    the recorded forward includes vLLM's W_UK / W_UV absorption around the attention
    task, and the update hook refreshes the latent write and the decode attention."""
    got, replays, updates, _, mode = _run(mla_path, parity_dtype)
    assert mode.name == "FULL_DECODE_ONLY"
    assert got == mla_expected
    assert replays > 0 and updates > 0


def test_mla_skipping_the_update_hook_breaks_decode_replay(mla_path, parity_dtype,
                                                          mla_expected, monkeypatch):
    from vllm_npu.attention.mla import NPUMLAImpl

    monkeypatch.setattr(NPUMLAImpl, "update_graph_params", lambda *a, **k: None)
    got, replays, _, _, _ = _run(mla_path, parity_dtype)
    assert replays > 0
    assert got != mla_expected


def test_mla_full_request_keeps_mixed_batches_out_of_graphs(mla_path, parity_dtype,
                                                            mla_expected):
    """Asked for FULL: vLLM narrows it to what the backend declares (UNIFORM_SINGLE_TOKEN_
    DECODE -> FULL_DECODE_ONLY); mixed batches run eagerly, tokens stay exact."""
    got, replays, updates, _, mode = _run(mla_path, parity_dtype,
                                          compilation_config={"cudagraph_mode": "FULL"})
    assert mode.name == "FULL_DECODE_ONLY"
    assert got == mla_expected
    assert replays > 0 and updates > 0
