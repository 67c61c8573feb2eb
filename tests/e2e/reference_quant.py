"""Independent fake-quant reference for ModelSlim W8A8 checkpoints: the HF model in plain
PyTorch with every quantised Linear replaced by quantise -> exact integer matmul ->
dequantise, read straight from the checkpoint files (no vllm_npu code)."""
from __future__ import annotations

import functools
import glob
import json
import os

import torch


class FakeQuantLinear(torch.nn.Module):
    def __init__(self, t: dict[str, torch.Tensor], name: str, scheme: str) -> None:
        super().__init__()
        self.scheme = scheme
        self.w = t[f"{name}.weight"].to(torch.int64)  # [n, k] integers
        self.bias = t.get(f"{name}.bias")
        if scheme == "W8A8":
            self.s = float(t[f"{name}.input_scale"].reshape(-1)[0])
            self.o = float(t[f"{name}.input_offset"].reshape(-1)[0])
            deq = t[f"{name}.deq_scale"]
            if deq.dtype == torch.int64:  # float32 bits in the low word
                deq = (deq & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
            self.deq = deq.float()
            self.qb = t[f"{name}.quant_bias"].to(torch.int64)
        else:
            self.ws = t[f"{name}.weight_scale"].reshape(-1).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1]).float()
        if self.scheme == "W8A8":
            xq = torch.round(x / self.s + self.o).clamp(-128, 127).to(torch.int64)
            acc = xq @ self.w.T + self.qb  # exact in int64; the float bias is inside qb
            y = acc.float() * self.deq
        else:
            t = x.abs().amax(dim=-1, keepdim=True) / 127
            xq = torch.where(t > 0, torch.round(x / torch.where(t > 0, t, 1.0)), 0.0)
            acc = xq.clamp(-128, 127).to(torch.int64) @ self.w.T
            y = acc.float() * self.ws * t
            if self.bias is not None:
                y = y + self.bias.float()
        return y.reshape(*shape[:-1], -1)


@functools.cache
def _fake_quant_model(path: str):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(os.path.join(path, "quant_model_description.json")) as f:
        desc = json.load(f)
    tensors: dict[str, torch.Tensor] = {}
    for file in glob.glob(os.path.join(path, "*.safetensors")):
        tensors.update(load_file(file))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                             dtype=torch.float32).eval()
    quantised = {k[:-len(".weight")]: v for k, v in desc.items()
                 if k.endswith(".weight") and v in ("W8A8", "W8A8_DYNAMIC")}
    floats = {k: v for k, v in tensors.items() if desc.get(k) == "FLOAT"
              and not any(k.startswith(q + ".") for q in quantised)}
    missing, _ = model.load_state_dict(floats, strict=False)
    leftover = [k for k in missing if not any(k.startswith(q + ".") for q in quantised)]
    assert not leftover, f"float weights missing from the checkpoint: {leftover}"
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    for name, scheme in quantised.items():
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, FakeQuantLinear(tensors, name, scheme))
    return model


@torch.inference_mode()
def fake_quant_greedy(path: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    model = _fake_quant_model(path)
    out = model(torch.tensor([prompt_ids]), use_cache=True)
    generated: list[int] = []
    for _ in range(max_tokens):
        token = int(out.logits[0, -1].argmax())
        generated.append(token)
        out = model(torch.tensor([[token]]), past_key_values=out.past_key_values,
                    use_cache=True)
    return generated


@torch.inference_mode()
def teacher_forced_mismatches(path: str, prompt_ids: list[int], tokens: list[int],
                              tie: float = 0.02) -> tuple[int, list[tuple[int, float]]]:
    """The reference's logits along `tokens` (teacher-forced). Returns (positions where
    `tokens` is not the reference's argmax, [(position, top-2 margin)] of them where the
    token is the runner-up of a near tie (margin < `tie`))."""
    model = _fake_quant_model(path)
    logits = model(torch.tensor([prompt_ids + tokens[:-1]])).logits[0, len(prompt_ids) - 1:]
    top = torch.topk(logits.float(), 2, dim=-1)
    wrong, ties = 0, []
    for pos, token in enumerate(tokens):
        if token == int(top.indices[pos, 0]):
            continue
        wrong += 1
        margin = float(top.values[pos, 0] - top.values[pos, 1])
        if token == int(top.indices[pos, 1]) and margin < tie:
            ties.append((pos, margin))
    return wrong, ties
