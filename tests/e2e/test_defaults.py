"""The corner users live in: vLLM's default engine settings, a real workload.

Every other engine test pins small batches (tests/helpers/engine.make_llm: 64 batched
tokens, 16 sequences, 10 KV blocks) to stay fast; this is how a graph-mode failure that
every user with default settings met went unseen. Here the architecture families (dense:
Llama; MLA with MoE + EP: DeepSeek-V3's shape, TP=2, with the EPLB runtime moving experts
as the workload runs) run with nothing but the dtype, the parallel layout and EPLB set:
vLLM's default scheduler (256 sequences, 8,192 batched tokens, chunked prefill, prefix
caching), the platform's default block size and graph mode (FULL_DECODE_ONLY, decode
graphs up to 256 requests), the default KV budget — and 132
concurrent requests: prompts from 1 to 4,000 tokens (past the 2,048-token compressed
causal mask, the long ones over prefill chunks shared with other requests), eight of them
behind one 1,000-token shared prefix (prefix-cache hits), and 10 to 22 new tokens each:
every request still decodes once the last prompt is in, and the decode batch shrinks from
all of them through many graph sizes.

Reference: HF transformers, greedy, float32, token for token, for every request (on a
device: in its bfloat16, a divergence allowed at a near tie, tests/helpers/reference.py).
The test also checks that the workload really reached the corner it is named after (full
8,192-token steps, prompts split over steps, decode batches above 128 replayed as graphs,
the shared prefix served from the cache, prefill matmuls on oneDNN's branch as vLLM's
batches take it, no threshold patched).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from tests.helpers.engine import shutdown, vocab
from tests.helpers.eplb_state import check_ranks_agree, worker_eplb_state
from tests.helpers.reference import hf_greedy, random_prompt
from vllm_npu.compilation.acl_graph import ACLGraphWrapper
from vllm_npu.ops.sim import linear as sim_linear
from vllm_npu.testing.tiny_model import DEEPSEEK_V3_MOE

MAX_LEN = 4096  # the models' max_position_embeddings: vLLM's default max_model_len
FAMILIES = {  # name -> (tiny model, engine arguments beyond the dtype)
    "dense": (dict(arch="llama"), {}),
    # DeepSeek-V3's shape: MLA, a dense first layer, then routed + shared experts; TP=2 with
    # the experts over 2 EP ranks, and the EPLB runtime moving them while the workload runs
    # (2 redundant experts; a window and step interval short enough that the workload
    # rebalances twice, where vLLM's defaults would wait 3,000 steps)
    "mla-moe-ep": (dict(arch="deepseek_v3", **DEEPSEEK_V3_MOE),
                   dict(tensor_parallel_size=2, enable_expert_parallel=True,
                        distributed_executor_backend="mp", enable_eplb=True,
                        eplb_config=dict(num_redundant_experts=2, step_interval=12,
                                         window_size=8))),
}

_ONEDNN = sim_linear._onednn  # whether this torch has oneDNN's linear (the unpatched check)

pytestmark = pytest.mark.usefixtures("spawn_workers")


def workload(v: int) -> tuple[list[list[int]], list[int]]:
    """132 prompts and their max_tokens (seeded; not chosen to pass): 120 of 1 to 1,500
    tokens, 4 of 2,049 to 4,000, 8 behind one 1,000-token shared prefix."""
    lengths = np.unique(np.geomspace(1, 1500, 170).round().astype(int)).tolist()
    lengths += [2049, 2600, 3300, 4000]
    prompts = [random_prompt(1000 + i, n, v) for i, n in enumerate(lengths)]
    shared = random_prompt(999, 1000, v)
    for i in range(8):  # spread out, so later ones are scheduled after the first is cached
        prompts.insert(17 * i, shared + random_prompt(2000 + i, 1 + 97 * i, v))
    return prompts, [10 + 7 * i % 13 for i in range(len(prompts))]


@functools.cache
def _model(root: str, family: str) -> str:
    from vllm_npu.testing.tiny_model import build_tiny_model

    return build_tiny_model(f"{root}/{family}", max_position_embeddings=MAX_LEN,
                            **FAMILIES[family][0])


class StepLog:
    """Every scheduler step's token counts per request (the engine core runs in-process)."""

    def __init__(self, llm):
        self.steps: list[dict[str, int]] = []
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        schedule = scheduler.schedule

        def spy(*args, **kwargs):
            out = schedule(*args, **kwargs)
            self.steps.append(dict(out.num_scheduled_tokens))
            return out

        scheduler.schedule = spy


def _replayed_sizes(llm) -> dict[int, int]:
    def read(worker=None):
        return dict(ACLGraphWrapper.stats.replayed_sizes)

    if llm.llm_engine.vllm_config.parallel_config.world_size == 1:
        return read()
    return llm.collective_rpc(read)[0]


@pytest.fixture(scope="module", params=list(FAMILIES))
def run(request, tmp_path_factory, parity_dtype):
    """One engine per family with vLLM's defaults, the workload through it once."""
    from vllm import LLM, SamplingParams

    family = request.param
    path = _model(str(tmp_path_factory.getbasetemp() / "defaults"), family)
    prompts, max_tokens = workload(vocab(path))
    ACLGraphWrapper.stats.replayed_sizes.clear()
    llm = LLM(path, dtype=parity_dtype, **FAMILIES[family][1])
    onednn = []
    try:
        log = StepLog(llm)
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
                  for n in max_tokens]
        with pytest.MonkeyPatch.context() as mp:  # asked only for matmuls of 1,024+ rows
            mp.setattr(sim_linear, "_onednn", lambda: onednn.append(1) or _ONEDNN())
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                use_tqdm=False)
        config = llm.llm_engine.vllm_config
        # (the plugin's runtime takes EPLB over: vLLM's own flag reads False by now)
        eplb = llm.collective_rpc(worker_eplb_state) if FAMILIES[family][1].get("enable_eplb") \
            else None
        yield dict(path=path, prompts=prompts, max_tokens=max_tokens, config=config,
                   steps=log.steps, sizes=_replayed_sizes(llm), onednn=len(onednn),
                   got=[list(o.outputs[0].token_ids) for o in outs], eplb=eplb)
    finally:
        shutdown(llm)


def test_the_engine_runs_vllm_defaults(run):
    config = run["config"]
    assert config.model_config.max_model_len == MAX_LEN
    assert config.scheduler_config.max_num_seqs == 256
    assert config.scheduler_config.max_num_batched_tokens == 8192
    assert config.scheduler_config.enable_chunked_prefill
    assert config.cache_config.enable_prefix_caching
    assert config.cache_config.block_size == 128
    compilation = config.compilation_config
    assert compilation.cudagraph_mode.name == "FULL_DECODE_ONLY"
    assert compilation.max_cudagraph_capture_size == 512  # decode graphs up to 256 seqs


def test_the_workload_reaches_the_corner(run):
    steps, prompts = run["steps"], run["prompts"]
    assert len(prompts) >= 128 and max(map(len, prompts)) >= 4000
    assert max(sum(s.values()) for s in steps) > 8000  # full prefill steps
    prefill_steps: dict[str, int] = {}
    for step in steps:
        for req, n in step.items():
            if n > 1:
                prefill_steps[req] = prefill_steps.get(req, 0) + 1
    assert sum(k > 1 for k in prefill_steps.values()) >= 5  # prompts split over chunks
    assert max(len(s) for s in steps) >= 128  # decode batches of every request at once
    assert max(run["sizes"]) >= 128 and len(run["sizes"]) >= 8, run["sizes"]
    if run["config"].parallel_config.world_size == 1 and run["config"].model_config.dtype \
            == torch.float32 and _ONEDNN():  # prefill matmuls take oneDNN's branch, unpatched
        assert run["onednn"] > 0
    # every prompt token and every output but the last is scheduled once, except the
    # shared prefix's cached blocks: 7 full blocks of 128 for each of the 7 later requests
    work = sum(map(len, prompts)) + sum(n - 1 for n in run["max_tokens"])
    cached = work - sum(sum(s.values()) for s in steps)
    assert cached == 7 * 7 * 128, cached


def test_every_request_gives_hf_tokens(run, single_torch_thread):
    path = run["path"]
    expected = [hf_greedy(path, p, n) for p, n in zip(run["prompts"], run["max_tokens"])]
    wrong = [(i, len(p)) for i, (p, got, want)
             in enumerate(zip(run["prompts"], run["got"], expected)) if got != want]
    assert not wrong, \
        f"{len(wrong)} of {len(expected)} requests differ, (index, length): {wrong[:10]}"


@pytest.mark.parametrize("run", [f for f, (_, kw) in FAMILIES.items() if kw.get("enable_eplb")],
                         indirect=True)
def test_experts_move_under_the_defaults(run):
    """The EPLB runtime rebalanced during the workload (full prefill chunks, decode graphs
    replayed): experts moved, every rank holds the same placement and, in every slot, the
    checkpoint weights of the expert its map names (the tokens are checked against HF
    above)."""
    check_ranks_agree(run["eplb"])
    history = run["eplb"][0]["history"]
    assert len(history) >= 2 and sum(h[4] for h in history) > 0, history
    assert not any(h[5] for h in history), history  # nothing rolled back
