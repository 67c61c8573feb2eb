"""A sliding-window model (Mistral-style, window 48) on the NPU backend vs HF transformers."""
from __future__ import annotations

from tests.helpers.engine import generate, make_llm, shutdown, vocab
from tests.helpers.reference import hf_greedy, random_prompt

WINDOW = 48


def test_sliding_window_matches_hf(tmp_path, parity_dtype):
    from vllm_npu.testing.tiny_model import build_tiny_model

    path = build_tiny_model(str(tmp_path / "tiny-mistral"), arch="mistral",
                            sliding_window=WINDOW)
    prompts = [random_prompt(5, 150, vocab(path)),   # much longer than the window
               random_prompt(6, 30, vocab(path))]    # shorter: the window only bites later
    want = [hf_greedy(path, p, 40) for p in prompts]
    # The window changes the answer, so matching HF means the backend applied it.
    assert want[0] != hf_greedy(path, prompts[0], 40, sliding_window=None)
    llm = make_llm(path, parity_dtype)
    try:
        assert llm.llm_engine.vllm_config.model_config.get_sliding_window() == WINDOW
        assert generate(llm, prompts, 40) == want
    finally:
        shutdown(llm)
