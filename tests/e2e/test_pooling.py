"""Pooling models on the simulated NPU (`--runner pooling`) vs HF transformers (float32):
an embedding model (the tiny Llama: normalised last-token hidden state), a classifier
(3 labels, softmax) and a reranker (1 label, sigmoid of the pair's logit), offline and
over `vllm serve`'s `/v1/embeddings` and `/score`. Tolerance 1e-5 (float32 sums in a
different order)."""
from __future__ import annotations

import functools

import pytest
import requests
import torch

from tests.helpers.engine import make_llm, shutdown, vocab
from tests.helpers.reference import random_prompt
from tests.helpers.server import serve

TOL = 1e-5
QUERY, DOCS = "hello world", ["the npu runs", "abc def ghi"]


@pytest.fixture(scope="module")
def models(tiny_models, tmp_path_factory) -> dict[str, str]:
    from vllm_npu.testing.tiny_model import build_tiny_classifier

    root = tmp_path_factory.mktemp("pooling")
    llama = tiny_models["llama"]
    return {"embed": llama,
            "classify": build_tiny_classifier(llama, str(root / "cls3"), 3),
            "score": build_tiny_classifier(llama, str(root / "rerank"), 1)}


@functools.cache
def _hf(path: str, kind: str):
    from transformers import AutoModel, AutoModelForSequenceClassification

    cls = AutoModel if kind == "embed" else AutoModelForSequenceClassification
    return cls.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def _hf_embedding(path: str, ids: list[int]) -> torch.Tensor:
    hidden = _hf(path, "embed")(torch.tensor([ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1)


@torch.inference_mode()
def _hf_logits(path: str, ids: list[int]) -> torch.Tensor:
    return _hf(path, "classify")(torch.tensor([ids])).logits[0]


def _hf_pair_score(path: str, query: str, doc: str) -> float:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(path)(text=query, text_pair=doc).input_ids
    return float(torch.sigmoid(_hf_logits(path, ids))[0])


def _prompts(path: str) -> list[list[int]]:
    return [random_prompt(800 + i, n, vocab(path)) for i, n in enumerate((5, 40, 130))]


def _close(got, want) -> None:
    got, want = torch.tensor(got), torch.as_tensor(want)
    assert float((got - want).abs().max()) < TOL, (got, want)


def test_offline_embed_classify_and_score_match_hf(models, float32_only):
    for kind, path in models.items():
        llm = make_llm(path, float32_only, runner="pooling", enforce_eager=kind != "embed")
        try:
            prompts = [{"prompt_token_ids": p} for p in _prompts(path)]
            if kind == "embed":
                for p, out in zip(_prompts(path), llm.embed(prompts, use_tqdm=False)):
                    _close(out.outputs.embedding, _hf_embedding(path, p))
            elif kind == "classify":
                for p, out in zip(_prompts(path), llm.classify(prompts, use_tqdm=False)):
                    _close(out.outputs.probs, torch.softmax(_hf_logits(path, p), -1))
            else:
                outs = llm.score(QUERY, DOCS, use_tqdm=False)
                _close([o.outputs.score for o in outs],
                       [_hf_pair_score(path, QUERY, d) for d in DOCS])
        finally:
            shutdown(llm)


def test_embeddings_and_score_endpoints(models, float32_only, tmp_path):
    path = models["embed"]
    text = "hello world the npu"
    with serve(path, tmp_path, "--runner", "pooling", "--dtype", float32_only,
               "--max-model-len", "512") as base:
        by_ids, by_text = (requests.post(f"{base}/v1/embeddings",
                                         json={"model": "tiny", "input": value},
                                         timeout=60).json()
                           for value in ([_prompts(path)[1]], [text]))
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(path)(text).input_ids
    assert "data" in by_ids and "data" in by_text, (by_ids, by_text)
    _close(by_ids["data"][0]["embedding"], _hf_embedding(path, _prompts(path)[1]))
    _close(by_text["data"][0]["embedding"], _hf_embedding(path, ids))
    rerank = models["score"]
    with serve(rerank, tmp_path, "--runner", "pooling", "--dtype", float32_only,
               "--max-model-len", "512") as base:
        reply = requests.post(f"{base}/score", json={"model": "tiny", "text_1": QUERY,
                                                     "text_2": DOCS}, timeout=60).json()
    _close([d["score"] for d in reply["data"]],
           [_hf_pair_score(rerank, QUERY, d) for d in DOCS])
