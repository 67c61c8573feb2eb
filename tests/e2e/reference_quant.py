"""Independent fake-quant reference for int8 checkpoints (ModelSlim W8A8 / W8A8_DYNAMIC and
compressed-tensors int8): the HF model in plain PyTorch with every quantised Linear
replaced by quantise -> exact integer matmul -> dequantise, read straight from the
checkpoint files (no vllm_npu code)."""
from __future__ import annotations

import functools
import glob
import json
import os

import torch

from tests.e2e.reference import greedy


class FakeQuantLinear(torch.nn.Module):
    """`row_shards` > 1: a row-parallel layer under tensor parallelism, as the ranks run
    it: each rank quantises its slice of the input features (its own per-token scales),
    the bias (or quant_bias) counts on the first rank only, the partials are summed."""

    def __init__(self, t: dict[str, torch.Tensor], name: str, scheme: str,
                 row_shards: int = 1) -> None:
        super().__init__()
        self.scheme = scheme
        self.row_shards = row_shards
        self.w = t[f"{name}.weight"].to(torch.int64)  # [n, k] integers
        self.bias = t.get(f"{name}.bias")
        if scheme == "CT_STATIC":  # compressed-tensors: symmetric per-tensor input
            self.s = t[f"{name}.input_scale"].reshape(1).float()
            self.ws = t[f"{name}.weight_scale"].reshape(-1).float()
        elif scheme == "W8A8":
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
        if self.row_shards == 1:
            return self._partial(x, self.w, first=True).reshape(*shape[:-1], -1)
        k = x.shape[-1] // self.row_shards
        parts = [self._partial(x[:, i * k:(i + 1) * k], self.w[:, i * k:(i + 1) * k], i == 0)
                 for i in range(self.row_shards)]
        y = parts[0]
        for part in parts[1:]:
            y = y + part
        return y.reshape(*shape[:-1], -1)

    def _partial(self, x: torch.Tensor, w: torch.Tensor, first: bool) -> torch.Tensor:
        bias = self.bias if first else None
        if self.scheme == "CT_STATIC":
            xq = torch.round(x / self.s).clamp(-128, 127).to(torch.int64)
            y = (xq @ w.T).float() * self.ws * self.s
            if bias is not None:
                y = y + bias.float()
        elif self.scheme == "W8A8":
            xq = torch.round(x / self.s + self.o).clamp(-128, 127).to(torch.int64)
            acc = xq @ w.T + (self.qb if first else 0)  # exact; the float bias is in qb
            y = acc.float() * self.deq
        else:
            t = x.abs().amax(dim=-1, keepdim=True) / 127
            xq = torch.where(t > 0, torch.round(x / torch.where(t > 0, t, 1.0)), 0.0)
            acc = xq.clamp(-128, 127).to(torch.int64) @ w.T
            y = acc.float() * self.ws * t
            if bias is not None:
                y = y + bias.float()
        return y


ROW_PARALLEL = ("o_proj", "down_proj")


@functools.cache
def _fake_quant_model(path: str, tp: int = 1):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    tensors: dict[str, torch.Tensor] = {}
    for file in glob.glob(os.path.join(path, "*.safetensors")):
        tensors.update(load_file(file))
    desc_path = os.path.join(path, "quant_model_description.json")
    if os.path.exists(desc_path):
        with open(desc_path) as f:
            desc = json.load(f)
    else:  # compressed-tensors: quantised Linears are those with a weight_scale
        desc = {k: "FLOAT" for k in tensors}
        for k in tensors:
            if k.endswith(".weight_scale"):
                name = k[:-len(".weight_scale")]
                static = f"{name}.input_scale" in tensors
                for suffix in ("weight", "weight_scale", "input_scale"):
                    desc[f"{name}.{suffix}"] = "CT_STATIC" if static else "W8A8_DYNAMIC"
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                             dtype=torch.float32).eval()
    quantised = {k[:-len(".weight")]: v for k, v in desc.items()
                 if k.endswith(".weight") and v in ("W8A8", "W8A8_DYNAMIC", "CT_STATIC")}
    floats = {k: v for k, v in tensors.items() if desc.get(k) == "FLOAT"
              and not any(k.startswith(q + ".") for q in quantised)}
    missing, _ = model.load_state_dict(floats, strict=False)
    leftover = [k for k in missing if not any(k.startswith(q + ".") for q in quantised)]
    assert not leftover, f"float weights missing from the checkpoint: {leftover}"
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    for name, scheme in quantised.items():
        parent, _, attr = name.rpartition(".")
        shards = tp if attr in ROW_PARALLEL else 1
        setattr(model.get_submodule(parent), attr,
                FakeQuantLinear(tensors, name, scheme, shards))
    return model


def fake_quant_greedy(path: str, prompt_ids: list[int], max_tokens: int,
                      tp: int = 1) -> list[int]:
    return greedy(_fake_quant_model(path, tp), prompt_ids, max_tokens)


@torch.inference_mode()
def teacher_forced_mismatches(path: str, prompt_ids: list[int], tokens: list[int],
                              tie: float = 0.02, tp: int = 1
                              ) -> tuple[int, list[tuple[int, float]]]:
    """The reference's logits along `tokens` (teacher-forced). Returns (positions where
    `tokens` is not the reference's argmax, [(position, top-2 margin)] of them where the
    token is the runner-up of a near tie (margin < `tie`))."""
    model = _fake_quant_model(path, tp)
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
