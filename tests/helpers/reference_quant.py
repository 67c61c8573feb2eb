"""Independent fake-quant reference for int8 checkpoints (ModelSlim W8A8 / W8A8_DYNAMIC and
compressed-tensors int8): the HF model in plain PyTorch with every quantised Linear
replaced by quantise -> exact integer matmul -> dequantise, and every MoE layer with
quantised experts by a per-token, per-expert loop of the same, read straight from the
checkpoint files (no vllm_npu code)."""
from __future__ import annotations

import functools
import glob
import json
import os

import torch

from tests.helpers.reference import greedy


def _dynamic(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-token int8: (integers as int64, scale [rows, 1])."""
    t = x.abs().amax(dim=-1, keepdim=True) / 127
    xq = torch.where(t > 0, torch.round(x / torch.where(t > 0, t, 1.0)), 0.0)
    return xq.clamp(-128, 127).to(torch.int64), t


class FakeQuantExperts(torch.nn.Module):
    """HF's experts module (forward(hidden, top_k_index, top_k_weights)) for W8A8_DYNAMIC
    experts: out[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t]), each expert
    x -> per-token int8 -> (x_q @ W13_q^T) * s13 * t_x -> silu(gate) * up -> per-token int8
    -> (a_q @ W2_q^T) * s2 * t_a. `shards` > 1: the experts split over TP ranks as vLLM
    splits them (intermediate columns; each rank quantises its slice of the activation,
    the partial outputs are summed)."""

    def __init__(self, t: dict[str, torch.Tensor], prefix: str, shards: int = 1) -> None:
        super().__init__()
        self.shards = shards
        self.experts = []
        e = 0
        while f"{prefix}.{e}.gate_proj.weight" in t:
            p = f"{prefix}.{e}"
            self.experts.append(dict(
                gate=t[f"{p}.gate_proj.weight"].to(torch.int64),
                up=t[f"{p}.up_proj.weight"].to(torch.int64),
                down=t[f"{p}.down_proj.weight"].to(torch.int64),
                s_gate=t[f"{p}.gate_proj.weight_scale"].reshape(-1).float(),
                s_up=t[f"{p}.up_proj.weight_scale"].reshape(-1).float(),
                s_down=t[f"{p}.down_proj.weight_scale"].reshape(-1).float()))
            e += 1

    def _expert(self, x: torch.Tensor, w: dict) -> torch.Tensor:
        xq, tx = _dynamic(x)
        gate = (xq @ w["gate"].T).float() * w["s_gate"] * tx
        up = (xq @ w["up"].T).float() * w["s_up"] * tx
        act = torch.nn.functional.silu(gate) * up
        k = act.shape[-1] // self.shards
        out = None
        for r in range(self.shards):
            aq, ta = _dynamic(act[:, r * k:(r + 1) * k])
            part = (aq @ w["down"][:, r * k:(r + 1) * k].T).float() * w["s_down"] * ta
            out = part if out is None else out + part
        return out

    def forward(self, hidden_states, top_k_index, top_k_weights):
        x = hidden_states.float()
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(top_k_index.shape[1]):
                w = self.experts[int(top_k_index[t, j])]
                out[t] += top_k_weights[t, j].float() * self._expert(x[t:t + 1], w)[0]
        return out.to(hidden_states.dtype)


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
        """float32 math inside; the result in the model's dtype (the int8 matmul's output
        dtype on the device)."""
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, shape[-1]).float()
        if self.row_shards == 1:
            y = self._partial(x, self.w, first=True)
        else:
            k = x.shape[-1] // self.row_shards
            parts = [self._partial(x[:, i * k:(i + 1) * k], self.w[:, i * k:(i + 1) * k],
                                   i == 0) for i in range(self.row_shards)]
            y = parts[0]
            for part in parts[1:]:
                y = y + part
        return y.reshape(*shape[:-1], -1).to(dtype)

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
            xq, t = _dynamic(x)
            y = (xq @ w.T).float() * self.ws * t
            if bias is not None:
                y = y + bias.float()
        return y


ROW_PARALLEL = ("o_proj", "down_proj")


@functools.cache
def _fake_quant_model(path: str, tp: int = 1, expert_tp: bool = True,
                      dtype: torch.dtype = torch.float32):
    """`tp`: the ranks' row-parallel splits; `expert_tp` False: experts stay whole (EP);
    `dtype`: the float layers' dtype (the quantised ones compute in float32 and return it)."""
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
                                             dtype=dtype).eval()
    quantised = {k[:-len(".weight")]: v for k, v in desc.items()
                 if k.endswith(".weight") and v in ("W8A8", "W8A8_DYNAMIC", "CT_STATIC")}
    experts = {q.split(".experts.")[0] + ".experts" for q in quantised if ".experts." in q}
    quantised = {q: v for q, v in quantised.items() if ".experts." not in q}
    replaced = tuple(q + "." for q in [*quantised, *experts])
    floats = {k: v for k, v in tensors.items() if desc.get(k) == "FLOAT"
              and not k.startswith(replaced)}
    missing, _ = model.load_state_dict(floats, strict=False)
    tied = getattr(model.config, "tie_word_embeddings", False)
    leftover = [k for k in missing if not k.startswith(replaced)
                and not (tied and k == "lm_head.weight")]
    assert not leftover, f"float weights missing from the checkpoint: {leftover}"
    if tied:
        model.tie_weights()
    for name in experts:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr,
                FakeQuantExperts(tensors, name, tp if expert_tp else 1))
    for name, scheme in quantised.items():
        parent, _, attr = name.rpartition(".")
        shards = tp if attr in ROW_PARALLEL else 1
        setattr(model.get_submodule(parent), attr,
                FakeQuantLinear(tensors, name, scheme, shards))
    return model


def fake_quant_greedy(path: str, prompt_ids: list[int], max_tokens: int,
                      tp: int = 1, expert_tp: bool = True) -> list[int]:
    return greedy(_fake_quant_model(path, tp, expert_tp), prompt_ids, max_tokens)


@torch.inference_mode()
def teacher_forced_mismatches(path: str, prompt_ids: list[int], tokens: list[int],
                              tie: float = 0.02, tp: int = 1, expert_tp: bool = True
                              ) -> tuple[int, list[tuple[int, float]]]:
    """The reference's logits along `tokens` (teacher-forced). Returns (positions where
    `tokens` is not the reference's argmax, [(position, top-2 margin)] of them where the
    token is the runner-up of a near tie (margin < `tie`))."""
    model = _fake_quant_model(path, tp, expert_tp)
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


def fake_quant_model(path: str, dtype: torch.dtype):
    """The reference model in `dtype` (bfloat16 / float16 engines are scored against it)."""
    return _fake_quant_model(path, dtype=dtype)
