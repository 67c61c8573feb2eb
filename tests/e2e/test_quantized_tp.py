"""Int8 checkpoints with tensor parallelism (TP=2, vLLM's multiprocessing executor): the
fake-quant reference runs the row-parallel layers (o_proj, down_proj) as the two ranks do
(each quantises its half of the input features, dynamic schemes with their own per-token
scales; partial outputs summed). Its own module: no in-process engine may be alive while
the TP workers start."""
from __future__ import annotations

import pytest

from tests.e2e.engine import generate, make_llm, shutdown, vocab
from tests.e2e.reference import random_prompt
from tests.e2e.reference_quant import fake_quant_greedy, teacher_forced_mismatches

pytestmark = pytest.mark.usefixtures("spawn_workers")


@pytest.mark.parametrize("scheme,fmt", [("W8A8", "modelslim"), ("W8A8_DYNAMIC", "modelslim"),
                                        ("W8A8_DYNAMIC", "compressed-tensors")])
def test_tp2_matches_the_sharded_fake_quant_reference(tiny_models, parity_dtype, tmp_path,
                                                     scheme, fmt):
    from vllm_npu.testing.quantize_w8a8 import quantize_checkpoint

    path = quantize_checkpoint(tiny_models["llama"], str(tmp_path / "q"), scheme, fmt=fmt)
    prompts = [random_prompt(600 + i, n, vocab(path)) for i, n in enumerate((9, 70))]
    llm = make_llm(path, parity_dtype, tensor_parallel_size=2,
                   distributed_executor_backend="mp", enable_sleep_mode=False)
    try:
        got = generate(llm, prompts, 16)
    finally:
        shutdown(llm)
    for prompt, tokens in zip(prompts, got):
        if tokens != fake_quant_greedy(path, prompt, 16, tp=2):
            wrong, ties = teacher_forced_mismatches(path, prompt, tokens, tp=2)
            assert wrong == len(ties) <= 1, (wrong, ties)
