"""Targets with EAGLE, EAGLE-3 and MTP drafts that provably compute known functions (the
target's own, its argmin, or a partly different one), so that a proposer's acceptance
has an exact expectation.

The target (`build_three_token_target`: one decoder layer, Llama or DeepSeek-V3 MLA, no MLP)
predicts from its last three tokens. Its residual stream is four 32-dim slots:

    r_m = [e(x_m) | e(x_{m-1}) | e(x_{m-2}) | 0],   logits = lm_head(norm(r_m))

  * embedding rows live in slot 0: a token code in dims [0, 31) and the constant C at dim
    31, with RMS exactly 1 over the hidden size, so a unit-weight RMSNorm leaves them as
    they are (up to its eps) and every |e|^2 is the hidden size;
  * two attention heads copy the embedding of the token 1 (2) positions back into slot 1
    (2): query and key (their rotary parts) read only dim 31, so they are the same vectors
    at every position before RoPE, chosen so that the score peaks at that distance and any
    other distance below the model length scores >= GAP lower (`_rope_qk`): the other
    softmax weights are below e^-GAP, exactly 0 in float32. Values copy slot 0 (MLA: the
    latent is slot 0 through kv_a_layernorm, which only rescales it);
  * |r_m|^2 is then 3x the hidden size at every position m >= 2, and the final norm's
    weight sqrt(3) makes the hidden state vLLM hands the drafts exactly r_m.

A draft at position p reads token x_{p+1} (inputs shifted by one) and must propose the
target's next token after it, i.e. compute r_{p+1} = [e(x_{p+1}) | e(x_p) | e(x_{p-1})]:
slot 0 from its input token, which enters through a self head (attending its own position:
the draft step's KV write and sequence length must include it); slot 1 from slot 0 of the
hidden state it is passed (the target's r_p on the first step, its own output r_{p+j} on
step j + 1); slot 2 from a head attending 2 positions back in its own KV cache, to the
token embedding it read at p-2, which is x_{p-1} when the inputs are shifted (written by
this step's first pass, or an earlier one). So the draft is exact at every step for every
k, given the proposer shifts the input ids, passes the right hidden states, and advances
positions, slots and sequence lengths. Argmax lm_head(r) = argmax lm_head(norm(r)) for
any positive norm weight.

    eagle   fc = [token -> slot 3 | hidden slot 0 -> slot 1]; the layer (no input norm in
            EAGLE-1, no MLP) has a self head (distance 0) adding slot 3 to slot 0 and
            subtracting it from slot 3 (exactly 0 left), and a head at distance 2 copying
            slot 3 into slot 2; no final norm, the shared lm_head.
    eagle3  fc of the auxiliary hidden state (layer 0's input, e(x_p)): e(x_p) in slots 0-2,
            so it has |r|^2 like the draft's own outputs; `norm_before_residual` with a
            `hidden_norm` that keeps slot 0 only, so the residual starts as e_prev/sqrt(3)
            in slot 0, e_prev being the previous token's embedding either way. The token
            enters only through attention: self heads (peak at distance 0) write
            e(x_{p+1}) - e_prev/sqrt(3) into slot 0 and e_prev into slot 1, a head at
            distance 2 writes that position's token embedding into slot 2.
    mtp     eh_proj over [enorm(e) | hnorm(hidden) = r/sqrt(3)] = [token -> slot 3 |
            sqrt(3) * slot 0 -> slot 1]; the block's MLA (latent: slot 3) has eagle's two
            heads; shared_head.norm = sqrt(3). vLLM zeroes the MTP embedding at position 0,
            so the drafts at positions 1 and 2 are not exact: prompts of 4+ tokens keep
            every proposal at position >= 3.

A *wrong* draft is the equal one with its logits negated, so it proposes the target's
argmin, never its argmax: every first draft of a step is rejected, none is accepted.
eagle3 / mtp: final norm weight negated. eagle (no final norm, shares the lm_head): fc
negated, under which its layer is odd (q and k flip together, scores unchanged; values
and the output flip), so its hidden state is -r.

A *partial* draft is the equal one writing the token 2 back into slot 3 instead of slot 2:
it computes another known function, argmax lm_head([e(x_m) | e(x_{m-1}) | 0 |
e(x_{m-2})]) (the lm_head's slot-3 columns, which the target never reads, are its slot-2
columns plus noise), which agrees with the target on about half the contexts, so steps
accept some drafts and reject the rest; the acceptance follows from simulating greedy
speculative decoding with both functions. Its hidden states keep RMS sqrt(3): the
hidden-state path is the equal draft's.
"""
from __future__ import annotations

import math
import os

import torch

from vllm_npu.testing.tiny_drafts import read_config, save_checkpoint

SLOT = 32  # width of a residual slot; slot i is dims [SLOT * i, SLOT * (i + 1))
CODE = SLOT - 1  # token code in dims [0, CODE), the constant at dim CODE
CONST = 8.0
GAP = 250.0  # score gap (after scaling) between the attended position and any other
MAX_DISTANCE = 4096  # the gap holds at every distance below this (> any model length here)
NORM = math.sqrt(3.0)  # RMS of the target's residual, three RMS-1 slots
KINDS = ("equal", "wrong", "partial")


def _rope_qk(rope_dim: int, theta: float, scale: float, offset: int,
             interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k), rotary parts before RoPE, whose score scale * <RoPE_m q, RoPE_n k> is
    scale * rho^2 * sum_i cos((m - n - offset) * theta_i): largest at m - n = offset and at
    least GAP lower at any other distance < MAX_DISTANCE (rho^2 = GAP / (scale * min over
    d of sum_i (1 - cos(d * theta_i)))). Pairs are (i, i + rope_dim/2) (neox) or
    (2i, 2i + 1) (interleaved); a pair (a, b) is a + ib, rotated by e^{i pos theta_i};
    k = rho, q = rho e^{-i offset theta_i}."""
    n = rope_dim // 2
    freqs = theta ** (-torch.arange(n, dtype=torch.float64) * 2 / rope_dim)
    d = torch.arange(1, MAX_DISTANCE, dtype=torch.float64)[:, None]
    min_gap = float((1 - torch.cos(d * freqs)).sum(1).min())
    rho = math.sqrt(GAP / (scale * min_gap)) * 1.01
    k_re, k_im = torch.full((n,), rho, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    q_re, q_im = rho * torch.cos(offset * freqs), -rho * torch.sin(offset * freqs)

    def pack(re, im):
        out = torch.empty(rope_dim, dtype=torch.float64)
        if interleaved:
            out[0::2], out[1::2] = re, im
        else:
            out[:n], out[n:] = re, im
        return out.float()

    return pack(q_re, q_im), pack(k_re, k_im)


def _slot(i: int) -> slice:
    return slice(SLOT * i, SLOT * (i + 1))


def _embeddings(g: torch.Generator, vocab: int, hidden: int) -> torch.Tensor:
    code = torch.randn(vocab, CODE, generator=g, dtype=torch.float64)
    code *= math.sqrt(hidden - CONST ** 2) / code.norm(dim=1, keepdim=True)
    e = torch.zeros(vocab, hidden, dtype=torch.float64)
    e[:, :CODE], e[:, CODE] = code, CONST
    return e.float()


def _theta(cfg: dict) -> float:
    return float((cfg.get("rope_parameters") or {}).get("rope_theta")
                 or cfg.get("rope_theta", 10000.0))


def _load(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


def _no_mlp(h: int, inter: int, p: str) -> dict[str, torch.Tensor]:
    return {f"{p}.post_attention_layernorm.weight": torch.ones(h),
            f"{p}.mlp.gate_proj.weight": torch.zeros(inter, h),
            f"{p}.mlp.up_proj.weight": torch.zeros(inter, h),
            f"{p}.mlp.down_proj.weight": torch.zeros(h, inter)}


class _Heads:
    """q/k/v/o of a Llama attention with one kv head per query head (the targets' layout)
    over `inputs` input features; head i's scores come from `pattern(i, offset)`."""

    def __init__(self, cfg: dict, inputs: int):
        self.h, self.heads = cfg["hidden_size"], cfg["num_attention_heads"]
        self.d = cfg.get("head_dim") or self.h // self.heads
        if cfg["num_key_value_heads"] != self.heads or self.d != SLOT:
            raise ValueError(f"laid out for one kv head per query head of dim {SLOT}")
        self.theta = _theta(cfg)
        self.q, self.k = torch.zeros(self.heads * self.d, inputs), torch.zeros(
            self.heads * self.d, inputs)
        self.v, self.o = torch.zeros(self.heads * self.d, inputs), torch.zeros(
            self.h, self.heads * self.d)

    def pattern(self, head: int, offset: int, const_at: int, const: float) -> None:
        """Head `head` attends `offset` positions back, from the constant `const` that
        its input carries at feature `const_at`."""
        q, k = _rope_qk(self.d, self.theta, self.d ** -0.5, offset, interleaved=False)
        rows = slice(head * self.d, (head + 1) * self.d)
        self.q[rows, const_at], self.k[rows, const_at] = q / const, k / const

    def weights(self, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}.self_attn.{n}_proj.weight": w
                for n, w in zip("qkvo", (self.q, self.k, self.v, self.o))}


def _rows(head: int) -> slice:
    return slice(head * SLOT, (head + 1) * SLOT)


def _llama_layer(cfg: dict, p: str) -> dict[str, torch.Tensor]:
    """Heads 1 and 2 copy slot 0 from 1 and 2 positions back into slots 1 and 2."""
    a = _Heads(cfg, cfg["hidden_size"])
    for head, offset in ((1, 1), (2, 2)):
        a.pattern(head, offset, CODE, CONST)
        a.v[_rows(head), _slot(0)] = torch.eye(SLOT)
        a.o[_slot(offset), _rows(head)] = torch.eye(SLOT)
    return {f"{p}.input_layernorm.weight": torch.ones(cfg["hidden_size"]),
            **a.weights(p)}


def _mla_layer(cfg: dict, p: str, source: int, const: float,
               heads: list[tuple[int, dict[int, float]]]) -> dict[str, torch.Tensor]:
    """MLA head i of `heads` = (distance, {slot: coefficient}) attends `distance` positions
    back (q_nope = 0: scores come from the rotary key, shared by the heads) and adds slot
    `source` of that position's input times the coefficient to each slot (the latent is
    slot `source` copied, then kv_a_layernorm, whose factor kv_b_proj undoes). The input
    has the constant `const` at feature CODE of slot `source`."""
    h, n_heads, rank = cfg["hidden_size"], cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    if cfg.get("q_lora_rank") or cfg.get("rope_scaling") or vd != SLOT:
        raise ValueError("laid out for q_lora_rank None, no rope scaling, v_head_dim 32")
    const_at = SLOT * source + CODE
    wq = torch.zeros(n_heads, nope + rope, h)
    wkv = torch.zeros(rank + rope, h)
    wkv[:SLOT, _slot(source)] = torch.eye(SLOT)
    wkvb = torch.zeros(n_heads, nope + vd, rank)
    wo = torch.zeros(h, n_heads * vd)
    for head, (distance, writes) in enumerate(heads):
        q, k = _rope_qk(rope, _theta(cfg), (nope + rope) ** -0.5, distance,
                        interleaved=cfg.get("rope_interleave", True))
        wq[head, nope:, const_at] = q / const
        wkv[rank:, const_at] = k / const
        # the latent is slot `source` * sqrt(rank) / |e|, |e|^2 = h
        wkvb[head, nope:, :SLOT] = torch.eye(SLOT) * math.sqrt(h / rank)
        for slot, coefficient in writes.items():
            wo[_slot(slot), head * vd:(head + 1) * vd] = torch.eye(SLOT) * coefficient
    return {f"{p}.input_layernorm.weight": torch.ones(h),
            f"{p}.self_attn.q_proj.weight": wq.reshape(-1, h),
            f"{p}.self_attn.kv_a_proj_with_mqa.weight": wkv,
            f"{p}.self_attn.kv_a_layernorm.weight": torch.ones(rank),
            f"{p}.self_attn.kv_b_proj.weight": wkvb.reshape(-1, rank),
            f"{p}.self_attn.o_proj.weight": wo}


def build_three_token_target(path: str, arch: str = "llama", seed: int = 7) -> str:
    """A one-layer Llama (4 heads, 4 kv heads) or DeepSeek-V3 (MLA, dense) target that
    predicts from its last three tokens (module docstring), with the tiny models'
    tokenizer and a random lm_head. DeepSeek-V3 gets its MTP layer from
    `add_exact_mtp_layer`."""
    from vllm_npu.testing.tiny_model import build_tiny_model

    if arch not in ("llama", "deepseek_v3"):
        raise ValueError(f"arch={arch!r}; valid: 'llama', 'deepseek_v3'")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    extra = {"num_key_value_heads": 4} if arch == "llama" else {}
    build_tiny_model(path, arch=arch, num_hidden_layers=1, **extra)  # config + tokenizer
    cfg = read_config(path)
    h, vocab, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    if h != 4 * SLOT:
        raise ValueError(f"laid out for hidden_size {4 * SLOT}, not {h}")
    g = torch.Generator().manual_seed(seed)
    p = "model.layers.0"
    lm_head = torch.randn(vocab, h, generator=g) * 4 / h ** 0.5
    # slot 3, never read by the target, reads like slot 2 plus noise: a partial draft
    # (which writes slot 3 instead of 2) agrees with the target on about half the contexts
    lm_head[:, _slot(3)] = lm_head[:, _slot(2)] + 0.5 * lm_head[:, _slot(3)]
    weights = {"model.embed_tokens.weight": _embeddings(g, vocab, h),
               "model.norm.weight": torch.full((h,), NORM), "lm_head.weight": lm_head,
               **_no_mlp(h, inter, p)}
    weights.update(_llama_layer(cfg, p) if arch == "llama"
                   else _mla_layer(cfg, p, 0, CONST, [(1, {1: 1.0}), (2, {2: 1.0})]))
    if set(weights) != set(_load(path)):
        raise AssertionError(f"key mismatch: {sorted(set(weights) ^ set(_load(path)))}")
    return save_checkpoint(path, weights, cfg)


def _check_kind(kind: str) -> tuple[bool, int]:
    """(wrong, the slot the token 2 back goes to) of a draft kind."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; valid: {KINDS}")
    return kind == "wrong", 3 if kind == "partial" else 2


def build_exact_eagle_draft(path: str, target: str, method: str = "eagle",
                            kind: str = "equal") -> str:
    """An EAGLE-1 / EAGLE-3 head for `build_three_token_target(arch="llama")`, equal to it,
    wrong (proposing its argmin) or partial; the constructions are the module docstring's."""
    if method not in ("eagle", "eagle3"):
        raise ValueError(f"method={method!r}; valid: 'eagle', 'eagle3'")
    wrong, far = _check_kind(kind)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    cfg, target_weights = read_config(target), _load(target)
    h, vocab, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    config = dict(cfg, num_hidden_layers=1)
    if method == "eagle":
        fc = torch.zeros(h, 2 * h)
        fc[_slot(3), _slot(0)] = torch.eye(SLOT)  # the token's embedding -> slot 3
        fc[_slot(1), h:h + SLOT] = torch.eye(SLOT)  # the hidden state's slot 0 -> slot 1
        a = _Heads(cfg, h)  # input: the fc output, no norm
        for head, distance in ((0, 0), (2, 2)):
            a.pattern(head, distance, SLOT * 3 + CODE, CONST)
            a.v[_rows(head), _slot(3)] = torch.eye(SLOT)
        a.o[_slot(0), _rows(0)], a.o[_slot(3), _rows(0)] = torch.eye(SLOT), -torch.eye(SLOT)
        a.o[_slot(far), _rows(2)] += torch.eye(SLOT)
        weights = {"fc.weight": -fc if wrong else fc, **a.weights("layers.0"),
                   **_no_mlp(h, inter, "layers.0")}
        config["architectures"] = ["LlamaForCausalLM"]
    else:
        fc = torch.zeros(h, h)  # one auxiliary hidden state, layer 0's input e(x_p)
        for slot in range(3):
            fc[_slot(slot), _slot(0)] = torch.eye(SLOT)
        a = _Heads(cfg, 2 * h)  # input: [input_layernorm(e), hidden_norm(g)]
        hidden_slot0 = slice(h, h + SLOT)  # e_prev / sqrt(3)
        a.pattern(0, 0, CODE, CONST)
        a.v[_rows(0), _slot(0)], a.v[_rows(0), hidden_slot0] = torch.eye(SLOT), -torch.eye(SLOT)
        a.o[_slot(0), _rows(0)] = torch.eye(SLOT)  # + residual = e(x_{p+1})
        a.pattern(1, 0, CODE, CONST)
        a.v[_rows(1), hidden_slot0] = torch.eye(SLOT)
        a.o[_slot(1), _rows(1)] = torch.eye(SLOT) * NORM  # e_prev
        a.pattern(2, 2, CODE, CONST)
        a.v[_rows(2), _slot(0)] = torch.eye(SLOT)
        a.o[_slot(far), _rows(2)] = torch.eye(SLOT)  # the token read 2 positions back
        hidden_norm = torch.zeros(h)
        hidden_norm[_slot(0)] = 1.0
        weights = {"fc.weight": fc, "norm.weight": torch.full((h,), -1.0 if wrong else 1.0),
                   "lm_head.weight": target_weights["lm_head.weight"].clone(),
                   "midlayer.input_layernorm.weight": torch.ones(h),
                   "midlayer.hidden_norm.weight": hidden_norm,
                   **a.weights("midlayer"), **_no_mlp(h, inter, "midlayer")}
        aux = [0]
        config.update(eagle_aux_hidden_state_layer_ids=aux, num_aux_hidden_states=len(aux),
                      eagle_config={"eagle_aux_hidden_state_layer_ids": aux},
                      norm_before_residual=True, draft_vocab_size=vocab,
                      architectures=["LlamaForCausalLMEagle3"])
    return save_checkpoint(path, weights, config, target)


def add_exact_mtp_layer(path: str, kind: str = "equal") -> str:
    """Append to a `build_three_token_target(arch="deepseek_v3")` checkpoint, in place, the
    MTP layer equal to it, wrong (proposing its argmin) or partial (module docstring)."""
    wrong, far = _check_kind(kind)
    cfg, weights = read_config(path), _load(path)
    n, h, inter = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]
    new = f"model.layers.{n}"
    if f"{new}.eh_proj.weight" in weights:
        return path
    eh = torch.zeros(h, 2 * h)
    eh[_slot(3), _slot(0)] = torch.eye(SLOT)  # enorm(e) = e -> slot 3
    eh[_slot(1), h:h + SLOT] = torch.eye(SLOT) * NORM  # hnorm(r) = r / sqrt(3): e_prev
    # a self head moves the token from slot 3 to slot 0, one at distance 2 writes that
    # position's token into slot 2; the block's input norm divides [0 | e_prev | 0 | e]
    # by sqrt(2), the constant too
    weights.update(_mla_layer(cfg, new, 3, CONST / math.sqrt(2),
                              [(0, {0: 1.0, 3: -1.0}), (2, {far: 1.0})]))
    weights.update(_no_mlp(h, inter, new))
    weights.update({
        f"{new}.enorm.weight": torch.ones(h), f"{new}.hnorm.weight": torch.ones(h),
        f"{new}.eh_proj.weight": eh,
        f"{new}.shared_head.norm.weight": torch.full((h,), -NORM if wrong else NORM),
        f"{new}.shared_head.head.weight": weights["lm_head.weight"].clone(),
        f"{new}.embed_tokens.weight": weights["model.embed_tokens.weight"].clone()})
    cfg.update(num_nextn_predict_layers=1,
               first_k_dense_replace=max(cfg.get("first_k_dense_replace") or 0, n + 1))
    return save_checkpoint(path, weights, cfg)
