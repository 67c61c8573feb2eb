"""The architectures the engine tests serve, and the README's models table rendered from
them (`python -m tests.e2e.architectures` prints it; test_architectures.py fails when the
README's table differs from this registry, which is what it parametrizes)."""
from __future__ import annotations

from dataclasses import dataclass

FULL_DECODE_ONLY, FULL_AND_PIECEWISE = "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"
# With a TP run in FULL_AND_PIECEWISE beside it, FULL_DECODE_ONLY covers every mode: its
# prefills run eagerly (for Gemma 2 and Llama 4 everything does, they take no FULL graph),
# so a separate eager engine repeated the same tokens for ~9 s of CI each.
SINGLE_DEVICE = (FULL_DECODE_ONLY,)


@dataclass(frozen=True)
class Arch:
    hf_class: str              # the checkpoint's architecture
    tiny: str                  # tiny_archs.ARCHS or tiny_model builder key
    attention: str             # what the NPU attention backend runs for it
    modes: tuple[str, ...]     # single-device graph modes run here
    parallel: str = ""         # a TP run here in FULL_AND_PIECEWISE: "TP2" or "TP2+EP2"
    prompt_len: int = 7        # shortest prompt (4 prompts, 23 tokens apart)
    # a config override that changes HF's tokens: the feature bites in this model
    proof: tuple[tuple[str, object], ...] = ()
    note: str = ""             # graph-mode downgrades and other tests covering it
    # KV blocks: hybrids hold one state block per sequence a FULL decode graph may carry,
    # so vLLM wants as many blocks as its default max_num_seqs (256)
    blocks: int = 64

    @property
    def moe(self) -> bool:
        return "EP" in self.parallel


FIA = "paged attention / FIA"
ARCHS = {
    "opt": Arch("OPTForCausalLM", "opt", f"{FIA}, learned positions", SINGLE_DEVICE, "TP2"),
    "gpt2": Arch("GPT2LMHeadModel", "gpt2", f"{FIA}, learned positions", SINGLE_DEVICE, "TP2"),
    "gemma2": Arch("Gemma2ForCausalLM", "gemma2",
                   "soft-capped composition (no kernel takes a cap), sliding/full layers",
                   SINGLE_DEVICE, "TP2",
                   proof=(("attn_logit_softcapping", None), ("sliding_window", 4096)),
                   note="no FULL graphs (soft cap): FULL_DECODE_ONLY runs eagerly, "
                        "FULL_AND_PIECEWISE as PIECEWISE"),
    "gpt_oss": Arch("GptOssForCausalLM", "gpt_oss",
                    "FIA v2 with learnable sinks, sliding/full layers; MoE with biases and "
                    "npu_clipped_swiglu", SINGLE_DEVICE, "TP2+EP2",
                    proof=(("sliding_window", 4096),)),
    "llama4": Arch("Llama4ForCausalLM", "llama4",
                   f"{FIA}, chunked local attention (vLLM's virtual batches), NoPE layers; "
                   "sigmoid top-1 routing on the input", SINGLE_DEVICE, "TP2+EP2",
                   prompt_len=120, proof=(("attention_chunk_size", 4096),),
                   note="no FULL graphs (vLLM's chunked-local builder): FULL_DECODE_ONLY "
                        "runs eagerly, FULL_AND_PIECEWISE as PIECEWISE"),
    "ernie45_moe": Arch("Ernie4_5_MoeForCausalLM", "ernie45_moe",
                        f"{FIA}; softmax routing with a selection bias, shared expert",
                        SINGLE_DEVICE, "TP2+EP2"),
    "qwen3": Arch("Qwen3ForCausalLM", "qwen3", f"{FIA}, q/k norm", (FULL_AND_PIECEWISE,)),
    "gemma3": Arch("Gemma3ForCausalLM", "gemma3", f"{FIA}, sliding/full layers, q/k norm",
                   (FULL_AND_PIECEWISE,)),
    "phi3": Arch("Phi3ForCausalLM", "phi3", f"{FIA}, fused qkv", (FULL_AND_PIECEWISE,)),
    "starcoder2": Arch("Starcoder2ForCausalLM", "starcoder2",
                       f"{FIA}, LayerNorm, biases, GELU MLP", (FULL_AND_PIECEWISE,)),
    "mixtral": Arch("MixtralForCausalLM", "mixtral", f"{FIA}; softmax top-2 MoE",
                    (FULL_AND_PIECEWISE,)),
    "olmoe": Arch("OlmoeForCausalLM", "olmoe", f"{FIA}, q/k norm; softmax top-k MoE",
                  (FULL_AND_PIECEWISE,)),
    "qwen2_moe": Arch("Qwen2MoeForCausalLM", "qwen2_moe", f"{FIA}; MoE, gated shared expert",
                      (FULL_AND_PIECEWISE,)),
    "glm4_moe": Arch("Glm4MoeForCausalLM", "glm4_moe",
                     f"{FIA}, partial rotary; sigmoid grouped routing with a selection bias",
                     (FULL_AND_PIECEWISE,)),
    "deepseek_v2": Arch("DeepseekV2ForCausalLM", "deepseek_v2",
                        "MLA; grouped softmax routing, shared expert", (FULL_AND_PIECEWISE,)),
    "minimax_m2": Arch("MiniMaxM2ForCausalLM", "minimax_m2",
                       f"{FIA}, partial rotary; sigmoid routing with a selection bias",
                       (FULL_AND_PIECEWISE,)),
    "deepseek_v32": Arch("DeepseekV32ForCausalLM", "deepseek_v32",
                         "sparse MLA: npu_lightning_indexer picks each token's top-k keys "
                         "from its own bf16 key cache, npu_sparse_flash_attention attends "
                         "them on the latent cache; sigmoid grouped routing, shared expert",
                         (FULL_AND_PIECEWISE,), "TP2+EP2", proof=(("index_topk", 4096),),
                         note="no FULL graphs yet (sparse ops not graph tasks): "
                              "FULL_AND_PIECEWISE runs as PIECEWISE; chunked prefill, "
                              "prefix caching, preemption: test_hybrid_models"),
    "granite_hybrid": Arch("GraniteMoeHybridForCausalLM", "granite_hybrid",
                           "Mamba-2 mixers (causal conv1d, SSD chunk scan, selective-state "
                           "update) between NoPE attention layers on paired K/V half-pages; "
                           "MoE with a shared MLP", (FULL_AND_PIECEWISE,), "TP2+EP2",
                           note="chunked prefill and prefix caching carry the Mamba state: "
                                "test_hybrid_models", blocks=272),
    "qwen3_next": Arch("Qwen3NextForCausalLM", "qwen3_next",
                       "Gated DeltaNet layers (causal conv1d, chunked / recurrent gated delta "
                       "rule) between gated full-attention layers on paired K/V half-pages; "
                       "MoE with a gated shared expert", (FULL_AND_PIECEWISE,), "TP2+EP2",
                       note="chunked prefill and prefix caching carry the state: "
                            "test_hybrid_models", blocks=272),
    "qwen3_5": Arch("Qwen3_5ForCausalLM", "qwen3_5",
                    "Qwen3-Next's Gated DeltaNet / gated attention layers, dense MLP, "
                    "interleaved MRoPE sections", (FULL_AND_PIECEWISE,),
                    note="the text model; TP of these layers: qwen3_next", blocks=272),
    "llama": Arch("LlamaForCausalLM", "llama", FIA, (FULL_AND_PIECEWISE,),
                  note="every mode, TP/PP/DP, spec decode, LoRA: test_graph_modes, "
                       "test_parallel, test_offline_parity"),
    "qwen2": Arch("Qwen2ForCausalLM", "qwen2", f"{FIA}, tied embeddings", (FULL_AND_PIECEWISE,),
                  note="test_offline_parity"),
    "mistral": Arch("MistralForCausalLM", "mistral", f"{FIA}, sliding window (band mask)",
                    (FULL_AND_PIECEWISE,), note="test_sliding_window"),
    "qwen3_moe": Arch("Qwen3MoeForCausalLM", "qwen3_moe", f"{FIA}; softmax top-k MoE",
                      (FULL_AND_PIECEWISE,), note="EP, DP: test_moe_parity"),
    "deepseek_v3": Arch("DeepseekV3ForCausalLM", "deepseek_v3", "MLA (latent cache)",
                        (FULL_AND_PIECEWISE,), note="MLA modes, MoE, EPLB, DCP: test_mla_parity, "
                                                    "test_graph_modes, test_eplb_runtime"),
}
# Vision-language models (tests/e2e/test_vlm.py): images offline and over the OpenAI API,
# eager and the default graph mode, HF tokens for the same processor and images.
VLMS = {
    "Qwen2_5_VLForConditionalGeneration": "windowed ViT (blocks of window attention and full "
                                          "attention), 2x2 patch merging, MRoPE",
    "LlavaForConditionalGeneration": "CLIP tower (class token, second-to-last layer), MLP "
                                     "projector, Llama",
}
# Architectures vLLM 0.33 serves but the plugin does not yet, or vLLM cannot run without
# CUDA or missing packages (measured: shared/notes/vllm-0.33-models-and-upstream-tests.md).
NOT_SERVED = {
    "KimiLinearForCausalLM": "vLLM 0.33's model imports `cutlass` (CUDA only), with any platform",
}


def _modes(arch: Arch) -> str:
    return ", ".join(arch.modes)


def models_table() -> str:
    rows = ["| architecture | attention on the NPU | graph modes tested | parallel tested | "
            "notes |", "|---|---|---|---|---|"]
    for arch in ARCHS.values():
        parallel = f"{arch.parallel} (FULL_AND_PIECEWISE)" if arch.parallel else "-"
        rows.append(f"| `{arch.hf_class}` | {arch.attention} | {_modes(arch)} | {parallel} | "
                    f"{arch.note or '-'} |")
    for name, what in VLMS.items():
        rows.append(f"| `{name}` | {FIA}; vision encoder through `_npu_flash_attention_unpad`: "
                    f"{what} | FULL_DECODE_ONLY, eager | - | images: test_vlm |")
    for name, why in NOT_SERVED.items():
        rows.append(f"| `{name}` | not served | - | - | {why} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(models_table())
