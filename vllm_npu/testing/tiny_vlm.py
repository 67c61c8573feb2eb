"""Tiny vision-language checkpoints built locally: random weights, a trained tokenizer with the
model family's vision tokens, its image processor and chat template.

    python -m vllm_npu.testing.tiny_vlm models/tiny-qwen2_5_vl --arch qwen2_5_vl

Shapes are small but keep each family's structure: Qwen2.5-VL's windowed vision attention
with full-attention blocks, 2x2 patch merging and MRoPE sections in the language model;
LLaVA-1.5's CLIP vision tower (class token, learned positions, features from its
second-to-last layer) and MLP projector in front of a Llama.
"""
from __future__ import annotations

import argparse
import os

from vllm_npu.testing.tiny_model import _train_tokenizer, save_random_model

VLM_ARCHS = ("qwen2_5_vl", "llava")
QWEN_VISION_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                      "<|image_pad|>", "<|video_pad|>")
# Qwen's chat format: an image item becomes <|vision_start|><|image_pad|><|vision_end|>, which
# the processor widens to one pad per merged patch.
QWEN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' or c['type'] == 'image_url' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _qwen2_5_vl(path: str, vocab_size: int, seed: int):
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLProcessor, Qwen2VLImageProcessor,
                              Qwen2VLVideoProcessor)

    tok = _train_tokenizer(path, vocab_size, seed, QWEN_VISION_TOKENS, QWEN_CHAT_TEMPLATE)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_VISION_TOKENS}
    text = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=4096, rms_norm_eps=1e-6, dtype="float32",
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                # head_dim 32 -> 16 rotary pairs split over (time, height, width)
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [4, 6, 6]})
    # window 56 px = 2 merged patches a side; block 1 attends over the whole image
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  window_size=56, fullatt_block_indexes=[1], out_hidden_size=128,
                  tokens_per_second=2)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                              image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"],
                              vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"],
                              tie_word_embeddings=False)
    # 56x56 .. 448x448 pixels: 16 .. 1024 patches, 4 .. 256 image tokens after merging
    pixels = dict(patch_size=14, merge_size=2, temporal_patch_size=2,
                  min_pixels=56 * 56, max_pixels=448 * 448)
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        video_processor=Qwen2VLVideoProcessor(**pixels), tokenizer=tok,
        chat_template=QWEN_CHAT_TEMPLATE)
    return config, tok, processor


# LLaVA-1.5's conversation format; the processor widens <image> to one token per patch
LLAVA_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'].upper() }}: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' or c['type'] == 'image_url' %}"
    "<image>\n{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def _llava(path: str, vocab_size: int, seed: int):
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaProcessor

    tok = _train_tokenizer(path, vocab_size, seed, ("<image>",), LLAVA_CHAT_TEMPLATE)
    text = dict(model_type="llama", vocab_size=len(tok), hidden_size=128,
                intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6,
                dtype="float32", bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                tie_word_embeddings=False)
    # 112 px images in 14 px patches: 64 patches (+ the class token the projector drops)
    vision = dict(model_type="clip_vision_model", hidden_size=64, intermediate_size=128,
                  num_hidden_layers=3, num_attention_heads=2, image_size=112, patch_size=14,
                  projection_dim=64, hidden_act="quick_gelu")
    config = LlavaConfig(text_config=text, vision_config=vision,
                         image_token_index=tok.convert_tokens_to_ids("<image>"),
                         image_seq_length=64, vision_feature_layer=-2,
                         vision_feature_select_strategy="default", tie_word_embeddings=False)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 112},
                                         crop_size={"height": 112, "width": 112})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=14,
                               vision_feature_select_strategy="default",
                               num_additional_image_tokens=1,  # CLIP's class token
                               chat_template=LLAVA_CHAT_TEMPLATE)
    return config, tok, processor


def _llava_keys_as_released(path: str) -> None:
    """Released LLaVA checkpoints (llava-hf/llava-1.5-7b-hf) keep the CLIP tower under
    `vision_tower.vision_model.`, which is what vLLM 0.33 loads; transformers 5 saves it as
    `vision_tower.` (and reads both)."""
    from safetensors.torch import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    renamed = {("vision_tower.vision_model." + k[len("vision_tower."):]
                if k.startswith("vision_tower.") else k): v for k, v in tensors.items()}
    save_file(renamed, file, metadata={"format": "pt"})


def build_tiny_vlm(path: str, arch: str = "qwen2_5_vl", seed: int = 0, vocab_size: int = 512,
                   weight_scale: float = 4.0) -> str:
    """Write a checkpoint with its processor to `path` (if absent) and return the path."""
    if arch not in VLM_ARCHS:
        raise ValueError(f"arch={arch!r}; valid: {VLM_ARCHS}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    os.makedirs(path, exist_ok=True)
    config, tok, processor = (_qwen2_5_vl if arch == "qwen2_5_vl" else _llava)(
        path, vocab_size, seed)
    processor.save_pretrained(path)
    from transformers import AutoModelForImageTextToText

    save_random_model(path, config, tok, seed, weight_scale, model_cls=AutoModelForImageTextToText)
    if arch == "llava":
        _llava_keys_as_released(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--arch", choices=VLM_ARCHS, default="qwen2_5_vl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_tiny_vlm(args.path, args.arch, args.seed))


if __name__ == "__main__":
    main()
