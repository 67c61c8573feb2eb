"""`vllm serve MODEL --device npu` over HTTP on 127.0.0.1: completions, chat, streaming,
all token-for-token against HF transformers; and the CLI's startup refusals."""
from __future__ import annotations

import json

import pytest
import requests

from tests.helpers.engine import vocab as _vocab
from tests.helpers.reference import hf_greedy, random_prompt
from tests.helpers.server import complete, serve
from tests.helpers.server import run_cli as _run_cli


@pytest.fixture(scope="module")
def server(tiny_models, parity_dtype, tmp_path_factory):
    path = tiny_models["llama"]
    with serve(path, tmp_path_factory.mktemp("server"), "--dtype", parity_dtype,
               "--max-model-len", "1024", "--seed", "0", extra_env=None) as base:
        yield base, path


def test_completions_match_hf(server):
    base, path = server
    for seed, length in ((1, 7), (2, 140)):
        prompt = random_prompt(seed, length, _vocab(path))
        assert complete(base, prompt, 16) == hf_greedy(path, prompt, 16)


def test_chat_completions_match_hf(server):
    from transformers import AutoTokenizer

    base, path = server
    messages = [{"role": "user", "content": "hello world the npu runs vllm"}]
    r = requests.post(f"{base}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True})
    r.raise_for_status()
    body = r.json()
    prompt = AutoTokenizer.from_pretrained(path).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert body["prompt_token_ids"] == list(prompt)
    assert body["choices"][0]["token_ids"] == hf_greedy(path, list(prompt), 12)


def test_streaming_equals_non_streaming(server):
    base, path = server
    prompt = random_prompt(3, 20, _vocab(path))
    req = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0,
           "ignore_eos": True}
    full = requests.post(f"{base}/v1/completions", json=req, timeout=120).json()
    pieces = []
    with requests.post(f"{base}/v1/completions", json=req | {"stream": True}, stream=True,
                       timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                pieces.append(json.loads(line[6:])["choices"][0]["text"])
    assert len(pieces) >= 2  # really streamed, not one blob
    assert "".join(pieces) == full["choices"][0]["text"]


def test_device_other_than_npu_is_refused(tiny_models):
    res = _run_cli(tiny_models["llama"], "--device", "cuda")
    assert res.returncode != 0
    assert "--device 'cuda' is not available" in res.stderr
    assert "only --device npu" in res.stderr


def test_bad_additional_config_is_refused_at_startup(tiny_models):
    res = _run_cli(tiny_models["llama"], "--device", "npu", "--additional-config",
                   '{"decode_attention_op": "flash"}')
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "decode_attention_op='flash'" in out
    assert "paged_attention" in out and "fused_infer_attention" in out
