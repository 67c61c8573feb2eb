"""Tiny random-weight checkpoints of the architectures users serve, built from HF's own
config classes (shapes chosen here, nothing downloaded):

    python -m vllm_npu.testing.tiny_archs models/tiny-opt opt

Each entry exercises what makes its architecture different: learned positions without
rotary (OPT, GPT-2), logit soft-capping with alternating sliding/full layers (Gemma 2),
attention sinks, sliding layers, biased experts and a clamped SwiGLU (gpt-oss), chunked
local attention, NoPE layers and sigmoid top-1 routing on the input (Llama 4), and
ERNIE 4.5's MoE; and the architectures served before those (Qwen3, Gemma 3, Phi-3,
Starcoder2, Mixtral, OLMoE, Qwen2-MoE, GLM-4.5-MoE, DeepSeek-V2, MiniMax-M2). Windows and
chunks are small so short prompts cross them.
"""
from __future__ import annotations

import argparse
import os

from vllm_npu.testing.tiny_model import _ROUTER_PARAMS, _train_tokenizer, save_random_model

_DENSE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=2048)
_GQA = dict(_DENSE, num_key_value_heads=2, head_dim=32, intermediate_size=256)
_GQA_NO_HEAD_DIM = {k: v for k, v in _GQA.items() if k != "head_dim"}  # configs without one
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def _opt(**ids):
    from transformers import OPTConfig

    return OPTConfig(ffn_dim=256, word_embed_proj_dim=128, do_layer_norm_before=True,
                     pad_token_id=ids["eos_token_id"], **_DENSE, **ids)


def _gpt2(**ids):
    from transformers import GPT2Config

    return GPT2Config(n_embd=128, n_layer=2, n_head=4, n_positions=2048, **ids)


def _gemma2(**ids):
    from transformers import Gemma2Config

    return Gemma2Config(**_GQA, sliding_window=16, query_pre_attn_scalar=1,
                        attn_logit_softcapping=2.0, final_logit_softcapping=10.0,
                        layer_types=["sliding_attention", "full_attention"],
                        rope_parameters=_ROPE, **ids)


def _gpt_oss(**ids):
    from transformers import GptOssConfig

    gqa = dict(_GQA, intermediate_size=64)
    return GptOssConfig(**gqa, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                        layer_types=["sliding_attention", "full_attention"],
                        attention_bias=True, tie_word_embeddings=False, **ids)  # YaRN rope


def _llama4(**ids):
    from transformers import Llama4TextConfig

    return Llama4TextConfig(**dict(_GQA, num_hidden_layers=4), intermediate_size_mlp=256,
                            num_local_experts=4, num_experts_per_tok=1,
                            interleave_moe_layer_step=2, attention_chunk_size=128,
                            no_rope_layer_interval=2, use_qk_norm=True,
                            attn_temperature_tuning=False, tie_word_embeddings=False,
                            rope_parameters=_ROPE, **ids)


def _ernie45_moe(**ids):
    from transformers import Ernie4_5_MoeConfig

    return Ernie4_5_MoeConfig(**dict(_GQA_NO_HEAD_DIM, num_hidden_layers=3),
                              moe_intermediate_size=64, moe_k=2, moe_num_experts=8,
                              moe_num_shared_experts=1, moe_layer_start_index=1,
                              moe_layer_interval=1, tie_word_embeddings=False,
                              rope_parameters=_ROPE, **ids)


_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=64)


# decay and step parameters keep HF's initial values (scaled, every state decays at once)
_SSM_PARAMS = ("A_log", "dt_bias", ".D")


def _granite_hybrid(**ids):
    """Granite 4.0-H: Mamba-2 mixers between attention layers (NoPE), MoE with a shared
    MLP. A small SSD chunk so prompts span several chunks. One B/C group, as Granite
    4.0-H ships: HF's PyTorch path normalises the gated output over all groups at once,
    vLLM per group (as the mamba_ssm kernels do), which differ from two groups on."""
    from transformers import GraniteMoeHybridConfig

    gqa = dict(_GQA_NO_HEAD_DIM, num_hidden_layers=4, intermediate_size=64)
    return GraniteMoeHybridConfig(**gqa, layer_types=["mamba", "attention"] * 2,
                                  mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1,
                                  mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                                  mamba_chunk_size=16, num_local_experts=4,
                                  num_experts_per_tok=2, shared_intermediate_size=128,
                                  position_embedding_type="nope", embedding_multiplier=2.0,
                                  logits_scaling=2.0, residual_multiplier=0.5,
                                  attention_multiplier=1 / 32 ** 0.5,
                                  tie_word_embeddings=False, **ids)


def _qwen3_next(**ids):
    """Qwen3-Next: Gated DeltaNet layers between gated full-attention layers, MoE."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(**dict(_GQA, num_hidden_layers=4), layer_types=[
        "linear_attention", "full_attention"] * 2, linear_conv_kernel_dim=4,
        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, num_experts=8, shared_expert_intermediate_size=128,
        rope_parameters=dict(_ROPE, partial_rotary_factor=0.25), tie_word_embeddings=False,
        **_MOE, **ids)


def _qwen3_5(**ids):
    """Qwen3.5 (text): Qwen3-Next's Gated DeltaNet / gated attention layout with a dense MLP;
    rotary on a quarter of each head with Qwen3.5's interleaved MRoPE sections (text-only
    positions make them plain RoPE)."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**dict(_GQA, num_hidden_layers=4), layer_types=[
        "linear_attention", "full_attention"] * 2, linear_conv_kernel_dim=4,
        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, tie_word_embeddings=False,
        rope_parameters=dict(_ROPE, partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                             mrope_interleaved=True), **ids)


def _deepseek_v32(**ids):
    """DeepSeek-V3.2: MLA whose keys a lightning indexer picks (top 16 per query, so
    prompts past 16 tokens attend sparsely); the sizes the NPU kernels take (latent 512,
    rope 64, index heads of 128), a dense first layer then sigmoid-routed MoE."""
    from transformers import DeepseekV32Config

    return DeepseekV32Config(**dict(_DENSE, num_key_value_heads=4), intermediate_size=256,
                             kv_lora_rank=512, q_lora_rank=32, qk_rope_head_dim=64,
                             qk_nope_head_dim=32, v_head_dim=32, index_topk=16,
                             index_n_heads=16, index_head_dim=128, n_routed_experts=8,
                             n_shared_experts=1, n_group=2, topk_group=1,
                             first_k_dense_replace=1, rope_parameters=_ROPE, **_MOE,
                             # what DeepSeek-V3.2's config.json says and vLLM reads (HF's
                             # router is sigmoid + selection bias without asking)
                             scoring_func="sigmoid", topk_method="noaux_tc", **ids)


def _hf(config_class: str, **kwargs):
    """A factory building HF's `config_class` from the shared sizes plus `kwargs`."""
    def factory(**ids):
        import transformers

        return getattr(transformers, config_class)(**kwargs, **ids)
    return factory


def _gemma3(**ids):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**_GQA, sliding_window=16, query_pre_attn_scalar=32,
                            layer_types=["sliding_attention", "full_attention"],
                            rope_parameters={"sliding_attention": _ROPE,
                                             "full_attention": _ROPE}, **ids)


# name -> (config factory, router parameter suffixes left unscaled, weight scale: large
# enough that greedy logits are well separated, small enough that generation varies)
ARCHS = {
    "opt": (_opt, (), 2.0),
    "gpt2": (_gpt2, (), 4.0),
    "gemma2": (_gemma2, (), 1.0),
    "gpt_oss": (_gpt_oss, ("mlp.router.weight", "mlp.router.bias"), 4.0),
    "llama4": (_llama4, ("feed_forward.router.weight",), 4.0),
    "ernie45_moe": (_ernie45_moe, ("mlp.gate.weight", "moe_statics.e_score_correction_bias"),
                    4.0),
    # architectures that served before these: kept green in the piecewise modes
    "qwen3": (_hf("Qwen3Config", **_GQA, rope_parameters=_ROPE), (), 4.0),
    "gemma3": (_gemma3, (), 2.0),
    "phi3": (_hf("Phi3Config", **_GQA_NO_HEAD_DIM,
                 rope_parameters=_ROPE, pad_token_id=None), (), 4.0),
    "starcoder2": (_hf("Starcoder2Config", **_GQA_NO_HEAD_DIM,
                       use_bias=True, rope_parameters=_ROPE), (), 4.0),
    "mixtral": (_hf("MixtralConfig", **_GQA, num_local_experts=4, num_experts_per_tok=2,
                    rope_parameters=_ROPE), ("gate.weight",), 4.0),
    "olmoe": (_hf("OlmoeConfig", **_GQA_NO_HEAD_DIM,
                  num_experts=8, num_experts_per_tok=2, rope_parameters=_ROPE),
              ("gate.weight",), 4.0),
    "qwen2_moe": (_hf("Qwen2MoeConfig", **_GQA_NO_HEAD_DIM,
                      num_experts=8, shared_expert_intermediate_size=128,
                      rope_parameters=_ROPE, **_MOE), ("gate.weight",), 4.0),
    "glm4_moe": (_hf("Glm4MoeConfig", **_GQA,  # vLLM reads head_dim, HF's class has none
                     n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1,
                     first_k_dense_replace=1, routed_scaling_factor=2.5, use_qk_norm=True,
                     rope_parameters=dict(_ROPE, partial_rotary_factor=0.5), **_MOE),
                 ("gate.weight",), 4.0),
    "deepseek_v2": (_hf("DeepseekV2Config", **_DENSE,
                        num_key_value_heads=4, intermediate_size=256, kv_lora_rank=512,
                        q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32,
                        v_head_dim=32, n_routed_experts=8, n_shared_experts=1, n_group=2,
                        topk_group=1, topk_method="group_limited_greedy",
                        first_k_dense_replace=1, rope_parameters=_ROPE, **_MOE),
                    ("gate.weight",), 4.0),
    "deepseek_v32": (_deepseek_v32, ("gate.weight", "e_score_correction_bias"), 4.0),
    "granite_hybrid": (_granite_hybrid, ("router.layer.weight",) + _SSM_PARAMS, 4.0),
    "qwen3_next": (_qwen3_next, ("gate.weight", "shared_expert_gate.weight") + _SSM_PARAMS,
                   4.0),
    "qwen3_5": (_qwen3_5, _SSM_PARAMS, 4.0),
    "minimax_m2": (_hf("MiniMaxM2Config", **_GQA, num_local_experts=8, num_experts_per_tok=2,
                       rope_parameters=dict(_ROPE, partial_rotary_factor=0.5),
                       scoring_func="sigmoid", use_routing_bias=True, rotary_dim=16),
                   ("gate.weight", "e_score_correction_bias"), 4.0),
}


def build_tiny_arch(path: str, arch: str, seed: int = 0, vocab_size: int = 512) -> str:
    """Write `arch`'s checkpoint to `path` (if absent) and return the path."""
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r}; valid: {sorted(ARCHS)}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    factory, router, weight_scale = ARCHS[arch]
    os.makedirs(path, exist_ok=True)
    tok = _train_tokenizer(path, vocab_size, seed)
    config = factory(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id)
    save_random_model(path, config, tok, seed, weight_scale,
                      router_params=_ROUTER_PARAMS + router)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("arch", choices=sorted(ARCHS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_tiny_arch(args.path, args.arch, args.seed))


if __name__ == "__main__":
    main()
