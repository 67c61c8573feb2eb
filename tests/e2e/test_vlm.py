"""Vision-language models on the simulated NPU: a tiny Qwen2.5-VL (windowed vision attention,
patch merging, MRoPE) and a tiny LLaVA-1.5 (CLIP tower, MLP projector, Llama), each built
locally with its processor; images through LLM.generate and the OpenAI chat API give HF
transformers' greedy tokens for the same processor and images."""
from __future__ import annotations

import base64
import functools
import io

import numpy as np
import pytest
import requests

from tests.helpers.engine import shutdown
from tests.helpers.server import serve

MAX_TOKENS = 10
TEXT = "the npu runs"


@pytest.fixture(scope="module", params=["qwen2_5_vl", "llava"])
def vlm(request, tmp_path_factory) -> str:
    from vllm_npu.testing.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm(str(tmp_path_factory.mktemp("vlm") / f"tiny-{request.param}"),
                          arch=request.param)


def _image(seed: int, size: tuple[int, int]):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


IMAGES = {"wide": _image(1, (112, 84)), "square": _image(2, (140, 140)),
          "small": _image(3, (56, 56)), "large": _image(4, (336, 336))}  # 144 image tokens


def _messages(n_images: int, text: str = TEXT) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}] * n_images
             + [{"type": "text", "text": text}]}]


@functools.cache
def _hf(path: str):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return AutoProcessor.from_pretrained(path), model


def hf_greedy(path: str, names: tuple[str, ...], text: str = TEXT) -> list[int]:
    import torch

    processor, model = _hf(path)
    prompt = processor.apply_chat_template(_messages(len(names), text),
                                           add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[prompt], images=[IMAGES[n] for n in names] or None,
                       return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def _prompt(path: str, names: tuple[str, ...], text: str = TEXT) -> dict:
    processor, _ = _hf(path)
    prompt = {"prompt": processor.apply_chat_template(_messages(len(names), text),
                                                      add_generation_prompt=True,
                                                      tokenize=False)}
    if names:
        images = [IMAGES[n] for n in names]
        prompt["multi_modal_data"] = {"image": images[0] if len(images) == 1 else images}
    return prompt


# one image, other sizes, two images in one prompt, text only, one image with other words
CASES = [(("wide",), TEXT), (("square",), TEXT), (("small", "wide"), TEXT), ((), TEXT),
         (("wide",), "hello world"), (("large",), TEXT)]
# a prompt whose images fill at least one 128-token block (LLaVA: 64 tokens an image)
REPEAT = {"qwen2_5_vl": (("large",), TEXT), "llava": (("small", "wide"), TEXT)}


@pytest.mark.parametrize("mode", ["eager", "default", "FULL_AND_PIECEWISE"])
def test_images_through_generate_give_hf_tokens(vlm, parity_dtype, mode, mocker):
    from vllm import LLM, SamplingParams

    from vllm_npu import ops

    unpad = mocker.spy(ops, "_npu_flash_attention_unpad")

    # eager: 64-token steps, so the images' placeholders span prefill chunks, which read the
    # encoder's output from vLLM's encoder cache after the first; graphs: vLLM's steps
    kwargs = {"enforce_eager": True, "max_num_batched_tokens": 64} if mode == "eager" else \
        {} if mode == "default" else {"compilation_config": {"cudagraph_mode": mode}}
    llm = LLM(vlm, dtype=parity_dtype, max_model_len=1024, seed=0, num_gpu_blocks_override=64,
              limit_mm_per_prompt={"image": 2}, **kwargs)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    try:
        outs = llm.generate([_prompt(vlm, names, text) for names, text in CASES], params,
                            use_tqdm=False)
        repeat = REPEAT[vlm.rsplit("tiny-", 1)[1]]
        again = llm.generate([_prompt(vlm, *repeat)], params, use_tqdm=False)
    finally:
        shutdown(llm)
    got = [list(o.outputs[0].token_ids) for o in outs]
    assert got == [hf_greedy(vlm, names, text) for names, text in CASES]
    # the vision encoder's attention ran through the op surface (every layer of the tower),
    # sequence lengths on the host
    assert unpad.call_count >= 2
    assert all(c.args[3].device.type == "cpu" for c in unpad.call_args_list)
    # asked again: its first 128-token block (image tokens) from the prefix cache, same tokens
    assert again[0].num_cached_tokens >= 128
    assert list(again[0].outputs[0].token_ids) == got[CASES.index(repeat)]


def _data_url(name: str) -> str:
    buf = io.BytesIO()
    IMAGES[name].save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(base: str, content: list[dict]) -> requests.Response:
    return requests.post(f"{base}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True})


def test_openai_chat_with_image_urls(vlm, parity_dtype, tmp_path):
    with serve(vlm, tmp_path, "--dtype", parity_dtype, "--max-model-len", "1024",
               "--limit-mm-per-prompt", '{"image": 2}') as base:
        one = _chat(base, [{"type": "image_url", "image_url": {"url": _data_url("square")}},
                           {"type": "text", "text": TEXT}])
        two = _chat(base, [{"type": "image_url", "image_url": {"url": _data_url("small")}},
                           {"type": "image_url", "image_url": {"url": _data_url("wide")}},
                           {"type": "text", "text": TEXT}])
        bad = _chat(base, [{"type": "image_url",
                            "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}},
                           {"type": "text", "text": TEXT}])
        after = _chat(base, [{"type": "image_url", "image_url": {"url": _data_url("wide")}},
                             {"type": "text", "text": TEXT}])
    for response in (one, two, after):
        assert response.status_code == 200, response.text
    assert one.json()["choices"][0]["token_ids"] == hf_greedy(vlm, ("square",))
    assert two.json()["choices"][0]["token_ids"] == hf_greedy(vlm, ("small", "wide"))
    # a body that is no image: a 400 that says so, and the server goes on serving
    assert bad.status_code == 400, bad.text
    assert "image" in bad.json()["error"]["message"].lower()
    assert after.json()["choices"][0]["token_ids"] == hf_greedy(vlm, ("wide",))
