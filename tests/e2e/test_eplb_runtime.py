"""EPLB while serving on the simulated NPU: experts move between EP ranks during one
`generate` (TP=2 + EP, decode graphs captured, or piecewise and decode graphs at vLLM's
default batch sizes) and under `vllm serve` with DP=2 + EP, and
the greedy tokens stay HF's. A skewed router is balanced; a failed weight transfer is
rolled back with every slot still holding the expert its map names. The in-process engines
run in the engine host (tests/helpers/engine_host.py), whose log holds what they logged."""
from __future__ import annotations

import pytest

from tests.helpers.engine import generate, make_llm, shutdown, vocab
from tests.helpers.eplb_state import check_ranks_agree, worker_eplb_state
from tests.helpers.reference import hf_greedy, random_prompt
from tests.helpers.server import complete, serve
from vllm_npu.moe.expert_map import load_placement
from vllm_npu.testing.tiny_model import DEEPSEEK_V3_MOE

MODELS = {"qwen3_moe": dict(arch="qwen3_moe"),
          # experts 2 and 3 get nearly every token: all the load starts on EP rank 0
          "dsv3_moe_skewed": dict(arch="deepseek_v3", hot_experts=(2, 3), **DEEPSEEK_V3_MOE)}
EPLB = dict(enable_expert_parallel=True, enable_eplb=True,
            eplb_config=dict(num_redundant_experts=2, window_size=4, step_interval=4,
                             log_balancedness=True))
MP = dict(tensor_parallel_size=2, distributed_executor_backend="mp", enable_sleep_mode=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    from vllm_npu.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("eplb_rt")
    return {name: build_tiny_model(str(root / name), **kw) for name, kw in MODELS.items()}


def _prompts(path: str) -> list[list[int]]:
    v = vocab(path)
    return [random_prompt(1, 5, v), random_prompt(2, 90, v), random_prompt(3, 30, v)]


def _graph_facts(worker) -> dict:
    """A worker's scheduler limits, graph capture sizes and graph replays per batch size."""
    from vllm_npu.compilation.acl_graph import ACLGraphWrapper

    config = worker.vllm_config
    return {"batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "max_capture": config.compilation_config.max_cudagraph_capture_size,
            "replayed": dict(ACLGraphWrapper.stats.replayed_sizes)}


def _generate_and_states(path: str, dtype: str, runs: list, **overrides):
    """In the engine host: greedy tokens of each (prompts, max_tokens) run on one TP=2 + EP
    + EPLB engine, then every worker's EPLB state (with its graph facts)."""
    llm = make_llm(path, dtype, **MP, **EPLB, **overrides)
    try:
        outs = [generate(llm, prompts, n) for prompts, n in runs]
        states = llm.collective_rpc(worker_eplb_state)
        for state, facts in zip(states, llm.collective_rpc(_graph_facts)):
            state["graphs"] = facts
        return outs, states
    finally:
        shutdown(llm)


# vLLM's own scheduler defaults (256 sequences, 8,192 batched tokens) in place of the
# helpers' 64-token batches: the graph sizes reach 512, and the three prompts are prefilled
# in one batch
DEFAULT_BATCHES = dict(max_num_seqs=None, max_num_batched_tokens=None)


@pytest.mark.parametrize("model,graphs", [
    ("qwen3_moe", None), ("dsv3_moe_skewed", None),  # the platform's default graphs
    # piecewise graphs around the attention ops (the MoE layers inside them) for mixed
    # batches too, full graphs for decode batches, at vLLM's default batch sizes
    ("qwen3_moe", "FULL_AND_PIECEWISE")], ids=["qwen3_moe", "dsv3_moe_skewed",
                                               "qwen3_moe-FULL_AND_PIECEWISE-defaults"])
def test_rebalancing_during_generate_keeps_hf_tokens(models, parity_dtype, model, graphs,
                                                     engine_host):
    path = models[model]
    prompts = _prompts(path)
    mark = engine_host.log_offset()
    # ~42 steps: a rebalance cycle takes 4 steps of collection, one or more while the plan
    # is computed (on a thread: more under load), then the migration (~6 in all); 3 or more
    # cycles fit with room for slow plans
    overrides = {} if graphs is None else {"compilation_config": {"cudagraph_mode": graphs},
                                           **DEFAULT_BATCHES}
    (got,), states = engine_host.run(_generate_and_states, path, parity_dtype,
                                     [(prompts, 40)], **overrides)
    assert got == [hf_greedy(path, p, 40) for p in prompts]
    check_ranks_agree(states)
    history = states[0]["history"]
    assert len(history) >= 3 and sum(h[4] for h in history) > 0, history
    assert "EPLB rebalance #3: balancedness" in engine_host.log_since(mark)
    if graphs is not None:  # vLLM's defaults reached the workers, and the 125-token prefill
        facts = states[0]["graphs"]  # ran as one piecewise graph (padded to 128)
        assert facts["batched_tokens"] == 8192 and facts["max_capture"] == 512, facts
        assert any(n >= sum(map(len, prompts)) for n in facts["replayed"]), facts
    if model == "dsv3_moe_skewed":
        _, before, after, *_ = history[0]
        assert before < 0.7 and after > 0.9, history[0]
        done = history[0][-1]  # observed per-step balancedness, before vs after
        measured = states[0]["balancedness"]
        early = [b for step, b in measured if 0 < step < 4]
        late = [b for step, b in measured if step > done]
        assert sum(late) / len(late) > sum(early) / len(early) + 0.2, measured


def test_failed_transfers_roll_back_and_serving_goes_on(models, parity_dtype, engine_host,
                                                         tmp_path):
    path = models["qwen3_moe"]
    prompts = _prompts(path)
    exported = tmp_path / "map.json"
    mark = engine_host.log_offset()
    # layer 1 on EP rank 1 receives bad weights; layer 0 on EP rank 0 overruns its time
    (first, second), states = engine_host.run(
        _generate_and_states, path, parity_dtype,
        [(prompts, 24), (prompts[:1], 12)],  # the second: still serving afterwards
        env={"NPU_EPLB_FAIL_TRANSFER": "1:1,0:0:timeout"},
        additional_config={"eplb": {"transfer_timeout_s": 1.0},
                           "moe": {"export_expert_map_path": str(exported)}})
    assert first == [hf_greedy(path, p, 24) for p in prompts]
    assert second == [hf_greedy(path, prompts[0], 12)]
    check_ranks_agree(states)
    rolled = {}
    for h in states[0]["history"]:
        rolled.update(h[5])
    assert rolled == {1: [1], 0: [0]}, states[0]["history"]
    assert any(1 in h[3] for h in states[0]["history"])  # layer 1 moved later on
    for layer, phy2log in states[0]["placements"].items():  # the map rewritten each time
        assert load_placement(str(exported), layer, 8, 2).phy2log == phy2log
    out = engine_host.log_since(mark)
    assert "EPLB: layer 1: expert weight transfer failed on EP rank 1 (RuntimeError: " \
           "injected transfer failure" in out
    assert "EPLB: layer 0: expert weight transfer failed on EP rank 0 (timed out after" in out


def test_dp2_ep_serving_rebalances_and_matches_hf(models, parity_dtype, tmp_path):
    path = models["dsv3_moe_skewed"]
    prompts = _prompts(path)
    with serve(path, tmp_path, "--dtype", parity_dtype, "--max-model-len", "512",
               "--max-num-batched-tokens", "64", "--data-parallel-size", "2",
               "--enable-expert-parallel", "--api-server-count", "1", "--enable-eplb",
               "--eplb-config",
               '{"num_redundant_experts": 2, "window_size": 4, "step_interval": 4}') as base:
        got = [complete(base, p, 12) for p in prompts]
    log = (tmp_path / "serve.log").read_text()
    assert got == [hf_greedy(path, p, 12) for p in prompts]
    assert "EPLB rebalance #3: balancedness" in log, log[-3000:]
