"""MoE models on the simulated NPU vs HF transformers, token for token (float32):
Qwen3-MoE (softmax top-k, renormalised) and DeepSeek-V3 (MLA, a dense first layer, sigmoid
scores + correction bias, grouped top-k, a shared expert, routed scaling) — eager, under
the default FULL_DECODE_ONLY graphs, TP=2, TP=2 + EP (both dispatch paths), DP=2 + EP over
`vllm serve`, and a static expert map with replicas. Bad MoE setups stop at startup."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers.engine import generate, make_llm, shutdown, vocab
from tests.helpers.reference import hf_greedy, random_prompt, tokenize
from tests.helpers.server import complete, serve
from vllm_npu.compilation.acl_graph import ACLGraphWrapper
from vllm_npu.testing.tiny_model import DEEPSEEK_V3_MOE

MODELS = {"qwen3_moe": dict(arch="qwen3_moe"),
          "dsv3_moe": dict(arch="deepseek_v3", **DEEPSEEK_V3_MOE)}
MP = dict(distributed_executor_backend="mp", enable_sleep_mode=False)


pytestmark = pytest.mark.usefixtures("spawn_workers")


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory) -> dict[str, str]:
    from vllm_npu.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("moe")
    return {name: build_tiny_model(str(root / name), **kw) for name, kw in MODELS.items()}


def _prompts(path: str) -> list[list[int]]:
    """A text prompt, a one-token prompt, and prompts whose 64-token prefill chunks take
    the all-to-all path (make_llm batches at most 64 tokens) while decodes all-gather."""
    v = vocab(path)
    return [tokenize(path, "hello world the npu runs"), random_prompt(1, 1, v),
            random_prompt(2, 90, v), random_prompt(3, 150, v)]


def _expected(path: str, prompts, n: int = 12) -> list[list[int]]:
    return [hf_greedy(path, p, n) for p in prompts]


def _worker_moe_state(worker) -> dict:
    from vllm_npu.eplb.runtime.adaptor import moe_layers
    from vllm_npu.moe import dispatch

    methods = [v.method for v in moe_layers(worker.model_runner.get_model())]
    return {"modes": sorted(dispatch._seen), "local": [m._local for m in methods],
            "replicas": [m.replicas.tolist() for m in methods]}


def _tp2_tokens_and_state(path: str, dtype: str, prompts, **kwargs):
    """Greedy tokens and every worker's MoE state from a TP=2 engine (mp executor); run in
    the engine host (tests/helpers/engine_host.py)."""
    llm = make_llm(path, dtype, tensor_parallel_size=2, **MP, **kwargs)
    try:
        return generate(llm, prompts, 12), llm.collective_rpc(_worker_moe_state)
    finally:
        shutdown(llm)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "full-decode-graphs"])
def test_single_npu_matches_hf(moe_models, parity_dtype, model, graphs):
    path = moe_models[model]
    prompts = _prompts(path)
    llm = make_llm(path, parity_dtype, enforce_eager=not graphs, enable_sleep_mode=False)
    try:
        replays = ACLGraphWrapper.stats.replays
        got = generate(llm, prompts, 12)
        replays = ACLGraphWrapper.stats.replays - replays
    finally:
        shutdown(llm)
    assert got == _expected(path, prompts)
    assert (replays > 0) == graphs  # decode steps (MoE included) replayed captured graphs


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "tp2-ep"])
def test_tp2_matches_hf(moe_models, parity_dtype, engine_host, model, ep):
    path = moe_models[model]
    prompts = _prompts(path)
    got, state = engine_host.run(_tp2_tokens_and_state, path, parity_dtype, prompts,
                                 enable_expert_parallel=ep)
    assert got == _expected(path, prompts)
    if ep:  # each rank holds half the experts; prefills went all-to-all, decodes all-gather
        assert [s["local"][0] for s in state] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert all(s["modes"] == ["all_gather", "all_to_all"] for s in state)
    else:   # TP shards every expert
        assert all(s["local"][0] == list(range(8)) and not s["modes"] for s in state)


@pytest.mark.parametrize("model", list(MODELS))
def test_dp2_ep_serving_matches_hf(moe_models, parity_dtype, tmp_path, model):
    """--data-parallel-size 2 --enable-expert-parallel: two engine cores, tokens moved
    between them by the MoE layers (all-to-all for prefills, all-gather in decode graphs)."""
    path = moe_models[model]
    prompts = _prompts(path)
    with serve(path, tmp_path, "--dtype", parity_dtype, "--max-model-len", "512",
               "--max-num-batched-tokens", "64", "--data-parallel-size", "2",
               "--enable-expert-parallel", "--api-server-count", "1") as base:
        got = [complete(base, p, 12) for p in prompts]
    log = (tmp_path / "serve.log").read_text()
    assert got == _expected(path, prompts)
    for mode in ("all_to_all", "all_gather"):
        assert f"MoE expert-parallel dispatch {mode}" in log


def _map_with_replicas(path: str, tmp_path) -> str:
    """12 physical slots for 8 experts on 2 ranks: experts 0, 2, 5, 7 have two copies."""
    with open(f"{path}/config.json") as f:
        layers = json.load(f)["num_hidden_layers"]
    devices = [[0, 1, 2, 3, 5, 7], [4, 5, 6, 7, 0, 2]]
    doc = {"moe_layer_count": layers, "layer_list": [
        {"layer_id": lid, "device_count": 2,
         "device_list": [{"device_id": d, "device_expert": e} for d, e in enumerate(devices)]}
        for lid in range(layers)]}
    out = tmp_path / "map.json"
    out.write_text(json.dumps(doc))
    return str(out)


def test_expert_map_with_replicas_keeps_tokens(moe_models, parity_dtype, engine_host,
                                               tmp_path):
    path = moe_models["qwen3_moe"]
    prompts = _prompts(path)
    map_path = _map_with_replicas(path, tmp_path)
    exported = tmp_path / "exported.json"
    got, state = engine_host.run(
        _tp2_tokens_and_state, path, parity_dtype, prompts, enable_expert_parallel=True,
        additional_config={"moe": {"expert_map_path": map_path,
                                   "export_expert_map_path": str(exported)}})
    assert got == _expected(path, prompts)
    assert [s["local"][0] for s in state] == [[0, 1, 2, 3, 5, 7], [4, 5, 6, 7, 0, 2]]
    assert state[0]["replicas"][0] == [2, 1, 2, 1, 1, 2, 1, 2]
    assert json.loads(exported.read_text()) == json.loads(open(map_path).read())


# ---------------------------------------------------------------------- refused at start


def test_refused_at_startup(moe_models, parity_dtype, tmp_path):
    from vllm_npu.testing.tiny_model import build_tiny_model

    qwen = moe_models["qwen3_moe"]
    cases = []
    no_renorm = build_tiny_model(str(tmp_path / "dsv3-no-renorm"), arch="deepseek_v3",
                                 **(DEEPSEEK_V3_MOE | dict(norm_topk_prob=False)))
    cases.append((no_renorm, {}, "sigmoid scoring without renormalisation"))
    map_path = _map_with_replicas(qwen, tmp_path)  # written for 2 EP ranks
    cases.append((qwen, dict(additional_config={"moe": {"expert_map_path": map_path}}),
                  "this engine has 1 expert-parallel rank"))
    cases.append((qwen, dict(additional_config={"moe": {"ep_dispatch": "all_to_all"}}),
                  "cannot run inside ACL graphs"))
    quantized = tmp_path / "qwen-fp8"
    shutil.copytree(qwen, quantized)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (quantized / "config.json").write_text(json.dumps(config))
    cases.append((str(quantized), {}, "fp8 quantization is not supported on the NPU"))
    for path, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            llm = make_llm(path, parity_dtype, enable_sleep_mode=False, **kwargs)
            shutdown(llm)
