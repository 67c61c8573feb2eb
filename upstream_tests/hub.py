"""A tiny local Hugging Face hub for vLLM's own tests: the hub ids they name, built here.

Each id maps to a local model of the same architecture and config family (random weights,
2 layers, hidden 128) with a byte-level BPE tokenizer trained on a fixed corpus and
carrying the real tokenizer's special tokens (same order where the real ids are small:
OPT, Llama 2, Gemma) and a chat template of the same shape (ChatML for Qwen, header blocks
for Llama 3, turns for Gemma, User/Assistant markers for DeepSeek). Tests that compare vLLM
with HF on the same weights mean what they mean upstream; tests that assert a real model's
text or vocabulary cannot pass and are excluded in the allow-list for that reason.

Models are written in the hub cache's own layout (`models--org--name/snapshots/<rev>/`,
`refs/main`), so with `HF_HUB_CACHE` pointing here and `HF_HUB_OFFLINE=1` every path that
loads a hub id finds it: vLLM, HF's `from_pretrained`, the tests' own tokenizer loads.
`redirect.json` (vLLM's `VLLM_MODEL_REDIRECT_PATH`) maps the same ids to the snapshots.
Built deterministically on first use; the revision hashes the recipe, so a changed recipe
builds a new snapshot.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

HUB_FORMAT = 1  # bump to rebuild every model


@dataclass(frozen=True)
class Tokens:
    """A tokenizer family: its special tokens (first = id 0), roles and chat template."""
    specials: tuple[str, ...]
    eos: str
    bos: str | None = None
    pad: str | None = None
    unk: str | None = None
    prepend_bos: bool = False       # the real tokenizer's post-processor adds `bos`
    chat_template: str | None = None


# Whitespace control only where the real templates have it: a `{%-` after a literal
# newline would eat the newline the generation prompt ends with.
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% if enable_thinking is defined and enable_thinking is false %}"
          "<think>\n\n</think>\n\n{% endif %}{% endif %}")
LLAMA3_CHAT = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
               "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
               "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
               "\n\n{% endif %}")
GEMMA_CHAT = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
              "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
              "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
              "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
DEEPSEEK_CHAT = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                 "<｜User｜>{{ m['content'] }}{% elif m['role'] == 'assistant' %}"
                 "<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% else %}"
                 "{{ m['content'] }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}")

QWEN = Tokens(("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
               "<tool_call>", "</tool_call>"), eos="<|im_end|>", pad="<|endoftext|>",
              chat_template=CHATML)
QWEN_BASE = Tokens(QWEN.specials, eos="<|endoftext|>", pad="<|endoftext|>",
                   chat_template=CHATML)
LLAMA3 = Tokens(("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"),
                bos="<|begin_of_text|>", eos="<|eot_id|>", prepend_bos=True,
                chat_template=LLAMA3_CHAT)
LLAMA3_BASE = Tokens(LLAMA3.specials, bos="<|begin_of_text|>", eos="<|end_of_text|>",
                     prepend_bos=True)
LLAMA2 = Tokens(("<unk>", "<s>", "</s>"), bos="<s>", eos="</s>", unk="<unk>",
                prepend_bos=True)
ZEPHYR_CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
               "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
TINYLLAMA_CHAT = Tokens(LLAMA2.specials, bos="<s>", eos="</s>", unk="<unk>",
                        prepend_bos=True, chat_template=ZEPHYR_CHAT)
OPT = Tokens(("<s>", "<pad>", "</s>", "<unk>"), bos="</s>", eos="</s>", pad="<pad>",
             unk="<unk>", prepend_bos=True)
GPT2 = Tokens(("<|endoftext|>",), bos="<|endoftext|>", eos="<|endoftext|>",
              unk="<|endoftext|>")
GEMMA = Tokens(("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
               bos="<bos>", eos="<eos>", pad="<pad>", unk="<unk>", prepend_bos=True,
               chat_template=GEMMA_CHAT)
DEEPSEEK = Tokens(("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                   "<｜Assistant｜>"), bos="<｜begin▁of▁sentence｜>",
                  eos="<｜end▁of▁sentence｜>", prepend_bos=True, chat_template=DEEPSEEK_CHAT)
# R1's distilled models: Qwen 2.5 weights, DeepSeek's sentence and role tokens, and the
# thinking markers; the real template opens the answer with "<think>\n".
DEEPSEEK_R1 = Tokens(DEEPSEEK.specials + ("<think>", "</think>"),
                     bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>",
                     prepend_bos=True,
                     chat_template=DEEPSEEK_CHAT.replace("<｜Assistant｜>{% endif %}",
                                                         "<｜Assistant｜><think>\n{% endif %}"))
ERNIE45_THINKING = Tokens(("<unk>", "<s>", "</s>", "<think>", "</think>", "<response>",
                           "</response>", "<tool_call>", "</tool_call>"), bos="<s>",
                          eos="</s>", unk="<unk>")


@dataclass(frozen=True)
class Recipe:
    arch: str                       # a vllm_npu.testing builder: tiny_model or tiny_archs
    tokens: Tokens
    config: dict = field(default_factory=dict)  # config.json keys set after building
    # config attributes set before the weights are made: the real model's widths where
    # tests read them (prompt embeds of the real hidden size), depth and FFN stay tiny
    shape: dict = field(default_factory=dict)

    def revision(self) -> str:
        text = json.dumps([HUB_FORMAT, self.arch, repr(self.tokens), self.config]
                          + ([self.shape] if self.shape else []), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()


# The hub ids vLLM 0.33.0's tests load most (counted in its tests/ sources), and the ids
# beside them in the files the allow-list runs.
def _qwen3_next(**ids):
    """Qwen3-Next's family: three Gated DeltaNet layers, then gated full attention; MoE."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           linear_num_value_heads=4, linear_num_key_heads=2,
                           linear_key_head_dim=32, linear_value_head_dim=32,
                           num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                           shared_expert_intermediate_size=64, decoder_sparse_step=1,
                           layer_types=["linear_attention"] * 3 + ["full_attention"],
                           max_position_embeddings=262144, **ids)


# Families hub.py builds itself (the rest come from vllm_npu.testing): name -> (config
# factory, router parameters left unscaled, weight scale)
OWN_ARCHS = {"qwen3_next": (_qwen3_next, ("mlp.gate.weight", "shared_expert_gate.weight"),
                            2.0)}


def _ctx(n: int) -> dict:
    """The real model's context length (rotary models: no weight depends on it)."""
    return {"max_position_embeddings": n}


HUB: dict[str, Recipe] = {
    # the real widths; the head untied: tied to embeddings this wide, two random layers
    # would echo the last token forever
    "facebook/opt-125m": Recipe("opt", OPT, shape=dict(
        hidden_size=768, num_attention_heads=12, word_embed_proj_dim=768,
        tie_word_embeddings=False)),
    # 350m: post-LayerNorm, embeddings of 512 projected in and out of the 1024-wide layers
    "facebook/opt-350m": Recipe("opt", OPT, shape=dict(
        hidden_size=1024, num_attention_heads=16, word_embed_proj_dim=512,
        do_layer_norm_before=False, tie_word_embeddings=False)),
    "Qwen/Qwen3-0.6B": Recipe("qwen3", QWEN, _ctx(40960)),
    "Qwen/Qwen3-1.7B": Recipe("qwen3", QWEN, _ctx(40960)),
    "Qwen/Qwen3-4B": Recipe("qwen3", QWEN, _ctx(40960)),
    "Qwen/Qwen3-8B": Recipe("qwen3", QWEN, _ctx(40960)),
    "Qwen/Qwen3-32B": Recipe("qwen3", QWEN, _ctx(40960)),
    "Qwen/Qwen2.5-1.5B-Instruct": Recipe("qwen2", QWEN, _ctx(32768)),
    "Qwen/Qwen2.5-0.5B-Instruct": Recipe("qwen2", QWEN, _ctx(32768)),
    "Qwen/Qwen1.5-7B": Recipe("qwen2", QWEN_BASE, _ctx(32768)),
    "Qwen/Qwen3-Next-80B-A3B-Instruct": Recipe("qwen3_next", QWEN),
    "meta-llama/Llama-3.2-1B-Instruct": Recipe("llama", LLAMA3, _ctx(131072)),
    "meta-llama/Llama-3.2-1B": Recipe("llama", LLAMA3_BASE, _ctx(131072)),
    "meta-llama/Llama-3.1-8B-Instruct": Recipe("llama", LLAMA3, _ctx(131072)),
    "meta-llama/Meta-Llama-3-8B-Instruct": Recipe("llama", LLAMA3, _ctx(8192)),
    "unsloth/Meta-Llama-3.1-8B-Instruct": Recipe("llama", LLAMA3, _ctx(131072)),
    "hmellor/tiny-random-LlamaForCausalLM": Recipe("llama", LLAMA2),
    "JackFram/llama-68m": Recipe("llama", LLAMA2),
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": Recipe("llama", TINYLLAMA_CHAT),
    # GPT-2's 1024 learned positions (the model's context length)
    "openai-community/gpt2": Recipe("gpt2", GPT2, shape=dict(n_positions=1024)),
    "distilbert/distilgpt2": Recipe("gpt2", GPT2, shape=dict(n_positions=1024)),
    "google/gemma-3-1b-it": Recipe("gemma3", GEMMA, _ctx(32768)),
    "deepseek-ai/DeepSeek-V2-Lite": Recipe("deepseek_v2", DEEPSEEK, _ctx(163840)),
    "deepseek-ai/DeepSeek-V2-Lite-Chat": Recipe("deepseek_v2", DEEPSEEK, _ctx(163840)),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": Recipe("qwen2", DEEPSEEK_R1, _ctx(131072)),
    "baidu/ERNIE-4.5-21B-A3B-Thinking": Recipe("ernie45_moe", ERNIE45_THINKING,
                                               _ctx(131072)),
}

ROOT = Path(__file__).resolve().parent.parent / "build" / "upstream" / "hub"
CORPUS_LINES = 2000


def snapshot(hub_id: str, root: Path = ROOT) -> Path:
    recipe = HUB[hub_id]
    return root / f"models--{hub_id.replace('/', '--')}" / "snapshots" / recipe.revision()


def train_tokenizer(path: Path, tokens: Tokens, vocab_size: int = 512, seed: int = 0):
    """A byte-level BPE tokenizer with `tokens`' specials as ids 0.. in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from vllm_npu.testing.tiny_model import _corpus

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(tokens.specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(seed, CORPUS_LINES), trainer=trainer)
    if tokens.prepend_bos:
        bos = (tokens.bos, tok.token_to_id(tokens.bos))
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens.bos} $A", pair=f"{tokens.bos} $A {tokens.bos} $B",
            special_tokens=[bos])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=tokens.bos,
                                   eos_token=tokens.eos, pad_token=tokens.pad,
                                   unk_token=tokens.unk, add_bos_token=tokens.prepend_bos)
    if tokens.chat_template:
        fast.chat_template = tokens.chat_template
    fast.save_pretrained(path)
    return fast


def _config(arch: str, tok, tokens: Tokens):
    from vllm_npu.testing import tiny_archs, tiny_model

    ids = dict(vocab_size=len(tok), eos_token_id=tok.convert_tokens_to_ids(tokens.eos),
               bos_token_id=tok.convert_tokens_to_ids(tokens.bos or tokens.eos))
    if arch in OWN_ARCHS or arch in tiny_archs.ARCHS:
        factory, router, scale = OWN_ARCHS.get(arch) or tiny_archs.ARCHS[arch]
        return factory(**ids), tiny_model._ROUTER_PARAMS + router, scale
    config = tiny_model._config(arch, ids["vocab_size"], ids["bos_token_id"],
                                ids["eos_token_id"])
    return config, tiny_model._ROUTER_PARAMS, 4.0


def build(hub_id: str, root: Path = ROOT) -> Path:
    """The snapshot folder of `hub_id`, built if absent (atomically: a half-built model
    never looks finished)."""
    from transformers.utils import logging as hf_logging

    from vllm_npu.testing.tiny_model import save_random_model

    path = snapshot(hub_id, root)
    if (path / "config.json").exists():
        return path
    hf_logging.disable_progress_bar()
    recipe = HUB[hub_id]
    tmp = path.with_name(path.name + ".part")
    tmp.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(tmp, recipe.tokens)
    config, router, scale = _config(recipe.arch, tok, recipe.tokens)
    for key, value in recipe.shape.items():
        setattr(config, key, value)
    save_random_model(str(tmp), config, tok, seed=0, weight_scale=scale, router_params=router)
    if recipe.config:
        data = json.loads((tmp / "config.json").read_text())
        data.update(recipe.config)
        (tmp / "config.json").write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
    refs = path.parent.parent / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main").write_text(path.name)
    return path


def build_all(ids=None, root: Path = ROOT) -> Path:
    """Build `ids` (default: all) and write `redirect.json`; returns its path."""
    for hub_id in ids or HUB:
        build(hub_id, root)
    redirect = root / "redirect.json"
    built = {h: str(snapshot(h, root)) for h in HUB
             if (snapshot(h, root) / "config.json").exists()}
    redirect.write_text(json.dumps(built, indent=1, sort_keys=True))
    return redirect


# vLLM's ModelConfig() loads this when a test names no model (vllm/config/model.py)
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"


def used_by(source: str) -> list[str]:
    """The hub ids this test source names, and the model ModelConfig() defaults to (a
    file run alone then finds it as it does in a full run)."""
    return [h for h in HUB if f'"{h}"' in source or f"'{h}'" in source
            or h == DEFAULT_MODEL and "ModelConfig(" in source]


if __name__ == "__main__":
    print(build_all())
