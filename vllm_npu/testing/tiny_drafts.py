"""Draft checkpoints for speculative decoding on tiny local targets (random weights).

    eagle   an EAGLE-1 head for a Llama target (vLLM's EagleLlamaForCausalLM layout):
            fc [H, 2H] over (token embedding, target hidden state), one decoder layer
            without its input norm; embeddings and lm_head shared with the target
    eagle3  an EAGLE-3 head (Eagle3LlamaForCausalLM): fc over the target's auxiliary
            hidden states, one `midlayer` whose attention reads (embedding, hidden) [2H],
            its own norm and lm_head
    mtp     DeepSeek-V3 with `num_nextn_predict_layers=1`: the multi-token-prediction
            layer (`model.layers.{L}.{enorm,hnorm,eh_proj,shared_head}` + a decoder layer)
            appended to the target's own checkpoint, as DeepSeek ships it

The heads are random: a draft's proposals are mostly rejected, which is what makes
token-exact parity with speculation off a test of the verification path.
"""
from __future__ import annotations

import json
import os
import shutil

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def read_config(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def save_checkpoint(path: str, weights: dict[str, torch.Tensor], config: dict,
                    tokenizer_from: str | None = None) -> str:
    """One-file safetensors checkpoint + config.json at `path` (and `tokenizer_from`'s
    tokenizer files, for a draft beside its target)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()},
              os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for name in TOKENIZER_FILES if tokenizer_from else ():
        if os.path.exists(os.path.join(tokenizer_from, name)):
            shutil.copy(os.path.join(tokenizer_from, name), path)
    return path


def _llama_layer(prefix: str, cfg: dict, g: torch.Generator, qkv_in: int,
                 input_norm: bool, scale: float) -> dict[str, torch.Tensor]:
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads

    def w(*shape):
        return torch.randn(*shape, generator=g) * scale / shape[-1] ** 0.5

    out = {f"{prefix}.self_attn.q_proj.weight": w(heads * d, qkv_in),
           f"{prefix}.self_attn.k_proj.weight": w(kv_heads * d, qkv_in),
           f"{prefix}.self_attn.v_proj.weight": w(kv_heads * d, qkv_in),
           f"{prefix}.self_attn.o_proj.weight": w(h, heads * d),
           f"{prefix}.mlp.gate_proj.weight": w(inter, h),
           f"{prefix}.mlp.up_proj.weight": w(inter, h),
           f"{prefix}.mlp.down_proj.weight": w(h, inter),
           f"{prefix}.post_attention_layernorm.weight": torch.ones(h)}
    if input_norm:
        out[f"{prefix}.input_layernorm.weight"] = torch.ones(h)
    return out


def build_eagle_draft(path: str, target: str, method: str = "eagle", seed: int = 1,
                      scale: float = 1.0) -> str:
    """An EAGLE-1 (`method="eagle"`) or EAGLE-3 (`"eagle3"`) head for a Llama target."""
    if method not in ("eagle", "eagle3"):
        raise ValueError(f"method={method!r}; valid: 'eagle', 'eagle3'")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    cfg = read_config(target)
    if cfg.get("model_type") != "llama":
        raise ValueError(f"EAGLE heads here are for Llama targets, not {cfg.get('model_type')}")
    g = torch.Generator().manual_seed(seed)
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    config = dict(cfg, num_hidden_layers=1, architectures=["LlamaForCausalLM"])
    config.pop("torch_dtype", None)
    if method == "eagle":
        weights = {"fc.weight": torch.randn(h, 2 * h, generator=g) * scale / (2 * h) ** 0.5}
        weights.update(_llama_layer("layers.0", cfg, g, h, input_norm=False, scale=scale))
        return save_checkpoint(path, weights, config, target)
    aux = list(range(cfg["num_hidden_layers"]))  # the input of every target layer
    config.update(eagle_aux_hidden_state_layer_ids=aux, num_aux_hidden_states=len(aux),
                  eagle_config={"eagle_aux_hidden_state_layer_ids": aux}, draft_vocab_size=vocab,
                  architectures=["LlamaForCausalLMEagle3"])
    weights = {"fc.weight": torch.randn(h, len(aux) * h, generator=g) * scale
               / (len(aux) * h) ** 0.5,
               "norm.weight": torch.ones(h),
               "lm_head.weight": torch.randn(vocab, h, generator=g) * scale / h ** 0.5,
               "midlayer.hidden_norm.weight": torch.ones(h)}
    weights.update(_llama_layer("midlayer", cfg, g, 2 * h, input_norm=True, scale=scale))
    return save_checkpoint(path, weights, config, target)


def add_mtp_layer(path: str, seed: int = 2, scale: float = 1.0) -> str:
    """Append one DeepSeek multi-token-prediction layer to a DeepSeek-V3 checkpoint in
    place (config `num_nextn_predict_layers=1`); its decoder layer copies the shape of the
    checkpoint's last layer, dense or MoE."""
    from safetensors.torch import load_file, save_file

    cfg = read_config(path)
    if cfg.get("model_type") != "deepseek_v3":
        raise ValueError(f"MTP layers are DeepSeek-V3's, not {cfg.get('model_type')}")
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if len(files) != 1:
        raise ValueError(f"expected one safetensors shard in {path}, found {files}")
    weights = load_file(os.path.join(path, files[0]))
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    if f"model.layers.{n}.eh_proj.weight" in weights:
        return path
    g = torch.Generator().manual_seed(seed)
    last, new = f"model.layers.{n - 1}.", f"model.layers.{n}."
    for name in [k for k in weights if k.startswith(last)]:
        t = weights[name]
        fresh = torch.ones_like(t) if "norm" in name else \
            torch.randn(t.shape, generator=g) * scale * t.float().std()
        weights[new + name[len(last):]] = fresh.to(t.dtype)
    weights.update({
        new + "enorm.weight": torch.ones(h), new + "hnorm.weight": torch.ones(h),
        new + "eh_proj.weight": torch.randn(h, 2 * h, generator=g) * scale / (2 * h) ** 0.5,
        new + "shared_head.norm.weight": torch.ones(h),
        new + "shared_head.head.weight": weights["lm_head.weight"].clone(),
        new + "embed_tokens.weight": weights["model.embed_tokens.weight"].clone()})
    save_file(weights, os.path.join(path, files[0]))
    cfg["num_nextn_predict_layers"] = 1
    if last + "mlp.down_proj.weight" in weights:  # a dense last layer: keep the MTP one dense
        cfg["first_k_dense_replace"] = max(cfg.get("first_k_dense_replace") or 0, n + 1)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path
