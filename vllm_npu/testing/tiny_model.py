"""Build tiny, deterministic HF checkpoints locally: random weights + a trained tokenizer.

    python -m vllm_npu.testing.tiny_model models/tiny-llama --arch llama

Weights are scaled up so greedy logits are well separated (parity tests stay exact in
float32); the byte-level BPE tokenizer is trained on a fixed synthetic corpus.
"""
from __future__ import annotations

import argparse
import json
import os
import random

ARCHS = ("llama", "qwen2")
EXTRA_ARCHS = ("mistral",  # sliding-window attention; built on request
               "deepseek_v3",  # MLA, dense layers unless DEEPSEEK_V3_MOE overrides
               "qwen3_moe")  # softmax top-k MoE in every layer
# DeepSeek-V3 routing on a tiny scale: a dense first layer, then MoE layers with sigmoid
# scores, the noaux_tc correction bias, grouped top-k, a shared expert and routed scaling.
DEEPSEEK_V3_MOE = dict(first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
                       n_group=2, topk_group=1, n_shared_experts=1, moe_intermediate_size=64,
                       routed_scaling_factor=2.5, norm_topk_prob=True, topk_method="noaux_tc",
                       scoring_func="sigmoid")
# The router stays at its initial scale (logits std ~0.2): scaled up, sigmoid/softmax
# scores saturate and expert choice would hinge on ties.
_ROUTER_PARAMS = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")
CORPUS_WORDS = ("the npu runs vllm with paged attention and a simulated device while "
                "tokens flow through blocks of cache into every layer of the tiny model "
                "hello world ascend serving prefix chunk decode prefill sample greedy").split()


def _corpus(seed: int, lines: int = 2000) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(CORPUS_WORDS) for _ in range(rng.randint(4, 24)))
            for _ in range(lines)]


CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def _train_tokenizer(path: str, vocab_size: int, seed: int, specials: tuple[str, ...] = (),
                     chat_template: str = CHAT_TEMPLATE):
    """A byte-level BPE tokenizer; `specials` (a model family's control tokens) are whole
    tokens, and pad with EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=["<s>", "</s>", *specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    extra = dict(pad_token="</s>", additional_special_tokens=list(specials)) if specials else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   **extra)
    fast.chat_template = chat_template
    fast.save_pretrained(path)
    return fast


def _config(arch: str, vocab_size: int, bos: int, eos: int, **overrides):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3MoeConfig

    common = dict(vocab_size=vocab_size, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=2048, rms_norm_eps=1e-6, bos_token_id=bos,
                  eos_token_id=eos, dtype="float32", rope_theta=10000.0)
    common.update(overrides)
    if arch == "llama":
        return LlamaConfig(tie_word_embeddings=False, **common)
    if arch == "mistral":
        return MistralConfig(tie_word_embeddings=False, **common)
    if arch == "deepseek_v3":
        return _deepseek_v3_config(common)
    if arch == "qwen3_moe":
        moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                   norm_topk_prob=True, head_dim=32, decoder_sparse_step=1)
        moe.update(common)
        return Qwen3MoeConfig(tie_word_embeddings=False, **moe)
    return Qwen2Config(tie_word_embeddings=True, use_sliding_window=False, **common)


def _deepseek_v3_config(common: dict):
    """MLA attention with the latent the NPU's MLA kernels take (kv_lora_rank 512, rope 64)
    and small nope / value dims (override for DeepSeek-V3's nope 128 / v 128), 4 heads
    (the decode ops pad them to 8); every layer dense (no MoE)."""
    from transformers import DeepseekV3Config

    mla = dict(kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32,
               v_head_dim=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
               moe_intermediate_size=64, n_group=1, topk_group=1, rope_interleave=True)
    mla.update(common)
    mla["num_key_value_heads"] = mla["num_attention_heads"]
    mla.setdefault("first_k_dense_replace", mla["num_hidden_layers"])
    return DeepseekV3Config(tie_word_embeddings=False, **mla)


def build_tiny_model(path: str, arch: str = "llama", seed: int = 0, vocab_size: int = 512,
                     weight_scale: float = 4.0, hot_experts: tuple[int, ...] = (),
                     **config_overrides) -> str:
    """Write a checkpoint to `path` (if absent) and return the path. `hot_experts`
    (DeepSeek-V3 MoE only): experts whose selection bias is raised by 1, so the router
    picks them for nearly every token (a skewed load for EPLB)."""
    if arch not in ARCHS + EXTRA_ARCHS:
        raise ValueError(f"arch={arch!r}; valid: {ARCHS + EXTRA_ARCHS}")
    if hot_experts and arch != "deepseek_v3":
        raise ValueError(f"hot_experts needs arch 'deepseek_v3' (a selection bias), not {arch!r}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    os.makedirs(path, exist_ok=True)
    tok = _train_tokenizer(path, vocab_size, seed)
    config = _config(arch, len(tok), tok.bos_token_id, tok.eos_token_id, **config_overrides)
    save_random_model(path, config, tok, seed, weight_scale, hot_experts=hot_experts)
    return path


def save_random_model(path: str, config, tok, seed: int, weight_scale: float,
                      router_params: tuple[str, ...] = _ROUTER_PARAMS,
                      hot_experts: tuple[int, ...] = (), model_cls=None) -> None:
    """Random float32 weights for `config` (a `model_cls`, AutoModelForCausalLM by default),
    scaled by `weight_scale` except norms and `router_params`, saved with `tok`'s ids as the
    generation config."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = (model_cls or AutoModelForCausalLM).from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(router_params) and not p.any():
                # HF starts some routers at zero (ERNIE 4.5): every expert would tie, and
                # which of tied experts a top-k picks is the kernel's choice, not the model's
                p.copy_(torch.randn(p.shape) * (0.05 if name.endswith("bias") else 0.02))
            elif "norm" not in name and not name.endswith(router_params):
                p.mul_(weight_scale)
        for name, b in model.named_buffers():  # HF keeps the selection bias as a buffer
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape) * 0.05)  # steers selection, as trained ones do
                b[list(hot_experts)] += 1.0
    model.save_pretrained(path, safe_serialization=True)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}, f)


def build_tiny_classifier(src: str, path: str, num_labels: int) -> str:
    """`src`'s tiny decoder with a random classification head of `num_labels`
    (LlamaForSequenceClassification & co.): a classifier, or with one label a reranker
    (cross-encoder score = sigmoid of the logit). Pads with EOS, as HF needs for batches."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(src)
    torch.manual_seed(num_labels)
    model = AutoModelForSequenceClassification.from_pretrained(
        src, num_labels=num_labels, pad_token_id=config.eos_token_id, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--arch", choices=ARCHS + EXTRA_ARCHS, default="llama")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_tiny_model(args.path, args.arch, args.seed))


if __name__ == "__main__":
    main()
