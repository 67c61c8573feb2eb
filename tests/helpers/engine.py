"""Offline engine helpers shared by the end-to-end tests."""
from __future__ import annotations

import json
import os


def make_llm(path: str, dtype: str, **overrides):
    from vllm import LLM

    kwargs = dict(dtype=dtype, max_model_len=1024, max_num_seqs=16, seed=0,
                  max_num_batched_tokens=64, num_gpu_blocks_override=10,
                  enable_prefix_caching=True, disable_log_stats=False,
                  enable_sleep_mode=True)
    kwargs.update(overrides)
    return LLM(path, **kwargs)


def shutdown(llm) -> None:
    from vllm.distributed import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    del llm
    cleanup_dist_env_and_memory()  # collects the heap (gc.collect) itself


def generate(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def greedy_with_logprobs(llm, prompts: list[list[int]], max_tokens: int):
    """The engine's greedy tokens, each with the logprob it gave it: [(tokens, logprobs)]."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    results = []
    for o in outs:
        tokens = list(o.outputs[0].token_ids)
        results.append((tokens, [step[t].logprob
                                 for step, t in zip(o.outputs[0].logprobs, tokens)]))
    return results


def metric(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name)


def vocab(path: str) -> int:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)["vocab_size"]
