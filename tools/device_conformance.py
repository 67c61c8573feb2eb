"""Validate the simulated NPU against a real one, op by op.

Every op of the plugin's op surface (`vllm_npu.ops.OP_NAMES`) runs on torch_npu and on its
simulated twin with the same inputs, and one ACL-graph round trip (capture a paged
attention task, update it to new lengths on an update stream, replay) runs on both graph
runtimes; the tool prints a table with the largest difference per output and exits 1 on
any mismatch. One command on a 910B tells whether the simulator the CI trusts still
matches the device:

    python tools/device_conformance.py              # on an Ascend machine (torch_npu + CANN)
    python tools/device_conformance.py --dry-run    # anywhere: the simulated side only,
                                                    # to check that every case still runs

Inputs are bfloat16 (the device's dtype; `--dtype float16` for the other one), small and
seeded; host-side arguments (sequence-length lists, host int32 lengths) stay on the host.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

import torch

MASK_SIDE = 2048


@dataclass
class Case:
    name: str           # op name on the surface (OP_NAMES), or "graph:..." for round trips
    run: Callable       # run(ops, dev, dtype, gen) -> list of result tensors
    atol: float = 2e-2  # bf16/fp16 accumulation differences between kernels


def _randn(gen, *shape, dtype, dev, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(dev)


def _paged_kv(gen, dtype, dev, blocks=6, bs=128, hkv=2, d=64):
    k = _randn(gen, blocks, bs, hkv * d, dtype=dtype, dev=dev)
    v = _randn(gen, blocks, bs, hkv * d, dtype=dtype, dev=dev)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32).to(dev)
    return k, v, table


# ---- the cases ----------------------------------------------------------------------------

def _rms_norm(ops, dev, dtype, gen):
    x, w = _randn(gen, 5, 128, dtype=dtype, dev=dev), _randn(gen, 128, dtype=dtype, dev=dev)
    return list(ops.npu_rms_norm(x, w, 1e-6))


def _add_rms_norm(ops, dev, dtype, gen):
    x, r = (_randn(gen, 5, 128, dtype=dtype, dev=dev) for _ in range(2))
    w = _randn(gen, 128, dtype=dtype, dev=dev)
    return list(ops.npu_add_rms_norm(x, r, w, 1e-6))


def _rotary(mode):
    def run(ops, dev, dtype, gen):
        x = _randn(gen, 1, 6, 4, 64, dtype=dtype, dev=dev)
        angle = torch.rand(1, 6, 1, 32, generator=gen) * 6.28
        if mode == "half":
            angle = torch.cat((angle, angle), -1)
        else:
            angle = angle.repeat_interleave(2, -1)
        cos, sin = angle.cos().to(dtype).to(dev), angle.sin().to(dtype).to(dev)
        return [ops.npu_rotary_mul(x, cos, sin, mode)]
    return run


def _swiglu(ops, dev, dtype, gen):
    return [ops.npu_swiglu(_randn(gen, 5, 256, dtype=dtype, dev=dev), dim=-1)]


def _fia_kwargs(table, q_ends, kv_lens, heads=8, hkv=2, d=64):
    mask = torch.ones(MASK_SIDE, MASK_SIDE, dtype=torch.bool).triu_(1).to(table.device)
    return dict(atten_mask=mask, actual_seq_lengths=q_ends, actual_seq_lengths_kv=kv_lens,
                block_table=table, num_heads=heads, num_key_value_heads=hkv,
                scale=d ** -0.5, input_layout="TND", block_size=128, sparse_mode=3,
                softmax_lse_flag=True)


def _fia(ops, dev, dtype, gen):
    k, v, table = _paged_kv(gen, dtype, dev)
    q = _randn(gen, 5, 8, 64, dtype=dtype, dev=dev)  # a 4-token chunk and a decode
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **_fia_kwargs(table, [4, 5],
                                                                          [300, 131]))
    return [out, lse]


def _fia_out_case(sinks: bool):
    """The `.out` call graph capture records; with `sinks`, gpt-oss's form: FIA v2 under its
    argument names, learnable sinks and a sliding window (band, sparse_mode 4)."""
    def run(ops, dev, dtype, gen):
        k, v, table = _paged_kv(gen, dtype, dev)
        q = _randn(gen, 5, 8, 64, dtype=dtype, dev=dev)
        kwargs = _fia_kwargs(table, [4, 5], [300, 131])
        call, workspace_of = (ops.npu_fused_infer_attention_score_out,
                              ops._npu_fused_infer_attention_score_get_max_workspace)
        if sinks:
            from vllm_npu.attention.fia_calls import V2_NAMES

            kwargs = {V2_NAMES.get(name, name): value for name, value in kwargs.items()}
            kwargs.update(sparse_mode=4, pre_tokens=127, next_tokens=0,
                          learnable_sink=_randn(gen, 8, dtype=torch.bfloat16, dev=dev))
            call, workspace_of = (ops.npu_fused_infer_attention_score_v2_out,
                                  ops._npu_fused_infer_attention_score_v2_get_max_workspace)
        workspace = workspace_of(q, k, v, **kwargs)
        out = torch.empty_like(q)
        lse = torch.empty(5, 8, 1, dtype=torch.float32, device=q.device)
        call(q, k, v, out=[out, lse], workspace=workspace, **kwargs)
        return [out, lse]
    return run


def _clipped_swiglu(ops, dev, dtype, gen):
    x = _randn(gen, 5, 256, dtype=dtype, dev=dev, scale=4.0)  # past the clamp at 7
    return [ops.npu_clipped_swiglu(x, alpha=1.702, limit=7.0, bias=1.0, interleaved=True)]


def _paged_args(gen, dtype, dev, lens):
    k, v, table = _paged_kv(gen, dtype, dev)
    q = _randn(gen, 2, 8, 64, dtype=dtype, dev=dev)
    return dict(query=q, key_cache=k.view(6, 128, 2, 64), value_cache=v.view(6, 128, 2, 64),
                num_kv_heads=2, num_heads=8, scale_value=0.125, block_table=table,
                context_lens=torch.tensor(lens, dtype=torch.int32),
                out=torch.empty_like(q))


def _paged_attention(ops, dev, dtype, gen):
    args = _paged_args(gen, dtype, dev, [300, 17])
    workspace = ops._npu_paged_attention_get_workspace(**args)
    ops._npu_paged_attention(**args, workspace=workspace)
    return [args["out"]]


def _reshape_and_cache(ops, dev, dtype, gen):
    key, value = (_randn(gen, 3, 2, 64, dtype=dtype, dev=dev) for _ in range(2))
    kc, vc = (torch.zeros(4, 128, 2, 64, dtype=dtype, device=dev) for _ in range(2))
    ops._npu_reshape_and_cache(key, value, kc, vc,
                               torch.tensor([5, 130, 511], dtype=torch.int32).to(dev))
    return [kc, vc]


def _reshape_and_cache_mla(ops, dev, dtype, gen):
    """The MLA backend's write: K = kv_c_normed into the nope plane, V = k_pe into rope."""
    c, r = _randn(gen, 3, 1, 512, dtype=dtype, dev=dev), _randn(gen, 3, 1, 64, dtype=dtype,
                                                                 dev=dev)
    nope = torch.zeros(4, 128, 1, 512, dtype=dtype, device=dev)
    rope = torch.zeros(4, 128, 1, 64, dtype=dtype, device=dev)
    ops._npu_reshape_and_cache(c, r, nope, rope,
                               torch.tensor([0, 200, 511], dtype=torch.int32).to(dev))
    return [nope, rope]


def _mla_planes(gen, dtype, dev):
    nope = _randn(gen, 4, 128, 1, 512, dtype=dtype, dev=dev)
    rope = _randn(gen, 4, 128, 1, 64, dtype=dtype, dev=dev)
    q_nope = _randn(gen, 2, 16, 512, dtype=dtype, dev=dev)
    q_rope = _randn(gen, 2, 16, 64, dtype=dtype, dev=dev)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32).to(dev)
    return nope, rope, q_nope, q_rope, table


def _mla_decode(ops, dev, dtype, gen):
    nope, rope, q_nope, q_rope, table = _mla_planes(gen, dtype, dev)
    out = torch.empty(2, 16, 512, dtype=dtype, device=dev)
    ops.npu_multi_head_latent_attention(q_nope, q_rope, nope, rope, table, [200, 9], 16,
                                        576 ** -0.5, 1, output=out)
    return [out]


def _mla_decode_lse(ops, dev, dtype, gen):
    nope, rope, q_nope, q_rope, table = _mla_planes(gen, dtype, dev)
    out = torch.empty(2, 16, 512, dtype=dtype, device=dev)
    lse = torch.empty(2, 16, 1, dtype=dtype, device=dev)
    ops.npu_multi_head_latent_attention(
        q_nope, q_rope, nope, rope, table, [200, 0], 16, 576 ** -0.5, 1,
        calc_type="calc_type_ring", return_lse=True, output=out, lse=lse)
    return [out, lse]


def _mla_prefill_dense(ops, dev, dtype, gen):
    """MLA prefill (attention/mla_prefill.py): dense TND, Q/K 192, V 128, causal, lse; a
    float16 model's call runs in bfloat16 (dense_tnd.py)."""
    dtype = torch.bfloat16
    q, k = (_randn(gen, 7, 8, 192, dtype=dtype, dev=dev) for _ in range(2))
    v = _randn(gen, 7, 8, 128, dtype=dtype, dev=dev)
    mask = torch.ones(MASK_SIDE, MASK_SIDE, dtype=torch.bool).triu_(1).to(dev)
    out, lse = ops.npu_fused_infer_attention_score(
        q, k, v, atten_mask=mask, actual_seq_lengths=[3, 7], actual_seq_lengths_kv=[3, 7],
        num_heads=8, num_key_value_heads=8, scale=192 ** -0.5, input_layout="TND",
        sparse_mode=3, softmax_lse_flag=True)
    return [out, lse]


def _mla_form_drafts(ops, dev, dtype, gen):
    """MLA decode verifying drafts (attention/mla_spec_decode.py): the fused op's MLA form,
    query D 512 + rope 64 over the two latent planes, 8 query heads (4 padded: zero
    queries), 2 tokens per request, causal."""
    nope, rope, _, _, table = _mla_planes(gen, dtype, dev)
    q_nope = torch.cat([_randn(gen, 4, 4, 512, dtype=dtype, dev=dev),
                        torch.zeros(4, 4, 512, dtype=dtype, device=dev)], dim=1)
    q_rope = torch.cat([_randn(gen, 4, 4, 64, dtype=dtype, dev=dev),
                        torch.zeros(4, 4, 64, dtype=dtype, device=dev)], dim=1)
    mask = torch.ones(MASK_SIDE, MASK_SIDE, dtype=torch.bool).triu_(1).to(dev)
    keys = nope.view(4, 128, -1)
    out, lse = ops.npu_fused_infer_attention_score(
        q_nope, keys, keys, query_rope=q_rope, key_rope=rope.view(4, 128, -1), num_heads=8,
        num_key_value_heads=1, input_layout="TND", atten_mask=mask, sparse_mode=3,
        scale=576 ** -0.5, block_table=table, block_size=128, actual_seq_lengths=[2, 4],
        actual_seq_lengths_kv=[200, 9], softmax_lse_flag=True)
    return [out[:, :4], lse[:, :4]]


def _one_group(ops, dev, dtype, gen):
    """One expert slot on the rank (E experts over EP E): the group as its cumulative end
    (moe/experts.py; a count-type list of length 1 is refused by the doc)."""
    x = _randn(gen, 5, 64, dtype=dtype, dev=dev)
    w = _randn(gen, 1, 64, 32, dtype=dtype, dev=dev, scale=0.1)
    y = ops.npu_grouped_matmul([x], [w], group_list=torch.tensor([4]).to(dev), split_item=2,
                               group_type=0, group_list_type=0)[0]
    return [y[:4]]


def _attention_update(ops, dev, dtype, gen):
    lse = [(torch.randn(6, generator=gen) * 3).to(dev) for _ in range(3)]
    outs = [_randn(gen, 6, 64, dtype=dtype, dev=dev) for _ in range(3)]
    return list(ops.npu_attention_update(lse, outs, 1))


def _gating_top_k(ops, dev, dtype, gen):
    logits = _randn(gen, 7, 16, dtype=dtype, dev=dev)
    bias = _randn(gen, 16, dtype=dtype, dev=dev, scale=0.1)
    weights, ids, _ = ops.npu_moe_gating_top_k(
        logits, 4, bias=bias, k_group=2, group_count=4, group_select_mode=1, renorm=0,
        norm_type=1, out_flag=False, routed_scaling_factor=2.5, eps=1e-20)
    return [weights, ids]


def _moe_pipeline(ops, dev, dtype, gen):
    """init_routing_v2 -> grouped_matmul -> token_unpermute, as the MoE layer chains them."""
    tokens, hidden, inter, experts, k = 6, 64, 32, 8, 2
    x = _randn(gen, tokens, hidden, dtype=dtype, dev=dev)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    ids = ids.to(torch.int32).to(dev)
    expanded, row_idx, counts, _ = ops.npu_moe_init_routing_v2(
        x, ids, active_num=tokens * k, expert_num=experts, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[0, experts], row_idx_type=0)
    w = _randn(gen, experts, hidden, inter, dtype=dtype, dev=dev, scale=0.1)
    rows = ops.npu_grouped_matmul([expanded], [w], group_list=counts, split_item=2,
                                  group_type=0, group_list_type=1)[0]
    probs = torch.rand(tokens, k, generator=gen).to(dtype).to(dev)
    out = ops.npu_moe_token_unpermute(rows, row_idx.to(torch.int32), probs)
    return [expanded, row_idx, counts, rows, out]


def _int8(gen, *shape, dev):
    return torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8).to(dev)


def _quant_static(ops, dev, dtype, gen):
    """W8A8 static as quantization/w8a8.py runs it: npu_quantize's multiply form
    (div_mode=False, reciprocal scale and offset in the model dtype) -> npu_quant_matmul
    (int32 bias; deq_scale float32 for bf16, int64 float bits for fp16 output)."""
    x = _randn(gen, 6, 64, dtype=dtype, dev=dev, scale=3.0)
    reciprocal = (1.0 / (torch.rand(64, generator=gen) * 0.05 + 0.01)).to(dtype).to(dev)
    offsets = torch.randint(-4, 5, (64,), generator=gen).to(dtype).to(dev)
    x_q = ops.npu_quantize(x, reciprocal, offsets, torch.qint8, -1, False)
    w = _int8(gen, 64, 32, dev=dev)
    deq = torch.rand(32, generator=gen) * 1e-3
    if dtype == torch.float16:
        deq = deq.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    bias = torch.randint(-500, 500, (32,), generator=gen, dtype=torch.int32).to(dev)
    y = ops.npu_quant_matmul(x_q, w, deq.to(dev), bias=bias, output_dtype=dtype)
    return [x_q.to(torch.int32), y]


def _quant_dynamic(ops, dev, dtype, gen):
    """npu_dynamic_quant (per-token) -> npu_quant_matmul(pertoken_scale, float bias)."""
    x = _randn(gen, 6, 64, dtype=dtype, dev=dev)
    x_q, token_scale = ops.npu_dynamic_quant(x)
    w = _int8(gen, 64, 32, dev=dev)
    scale = (torch.rand(32, generator=gen) * 0.01).to(dev)
    bias = _randn(gen, 32, dtype=dtype, dev=dev)
    y = ops.npu_quant_matmul(x_q, w, scale, pertoken_scale=token_scale, bias=bias,
                             output_dtype=dtype)
    return [x_q.to(torch.int32), token_scale, y]


def _quant_grouped(ops, dev, dtype, gen):
    """init_routing_v2 -> npu_dynamic_quant -> per-token int8 grouped matmul (W8A8_DYNAMIC
    MoE experts; per-channel scales bfloat16 for bf16 output, float32 for fp16, as
    quantization/w8a8_moe.py passes them)."""
    tokens, hidden, inter, experts, k = 6, 64, 32, 4, 2
    x = _randn(gen, tokens, hidden, dtype=dtype, dev=dev)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    expanded, _, counts, _ = ops.npu_moe_init_routing_v2(
        x, ids.to(torch.int32).to(dev), active_num=tokens * k, expert_num=experts,
        expert_tokens_num_type=1, expert_tokens_num_flag=True,
        active_expert_range=[0, experts], row_idx_type=0)
    x_q, token_scale = ops.npu_dynamic_quant(expanded)
    w = _int8(gen, experts, hidden, inter, dev=dev)
    scale_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    scale = (torch.rand(experts, inter, generator=gen) * 0.01).to(scale_dtype).to(dev)
    y = ops.npu_grouped_matmul([x_q], [w], scale=[scale], per_token_scale=[token_scale],
                               group_list=counts, split_item=2, group_type=0,
                               group_list_type=1, output_dtype=dtype)[0]
    return [x_q.to(torch.int32), token_scale, y]


def _lora(ops, dev, dtype, gen):
    """Multi-LoRA: sgmv shrink / expand (prefill segments), bgmv shrink / expand (per
    token) into a slice."""
    x = _randn(gen, 7, 64, dtype=dtype, dev=dev)
    a = _randn(gen, 2, 1, 8, 64, dtype=dtype, dev=dev, scale=0.1)
    b = _randn(gen, 2, 1, 32, 8, dtype=dtype, dev=dev, scale=0.1)
    idx = torch.tensor([1, -1, 0], dtype=torch.int64).to(dev)
    lens = torch.tensor([3, 2, 2], dtype=torch.int64).to(dev)
    mid = torch.zeros(7, 8, dtype=torch.float32).to(dev)
    ops.npu_sgmv_shrink(x, a, idx, lens, mid, 2.0)
    y = torch.zeros(7, 48, dtype=dtype).to(dev)
    ops.npu_sgmv_expand(mid.to(dtype), b, idx, lens, y, 8, 32)
    per_token = torch.repeat_interleave(idx, lens)
    mid2 = torch.zeros(7, 8, dtype=torch.float32).to(dev)
    ops.npu_bgmv_shrink(x, a, per_token, mid2, 2.0)
    y2 = torch.zeros(7, 48, dtype=dtype).to(dev)
    ops.npu_bgmv_expand(mid2.to(dtype), b, per_token, y2, 8, 32)
    return [mid, y, mid2, y2]


def _conv1d(ops, dev, dtype, gen):
    """A prefill of two requests (the second from a state), then one decode step each."""
    width, dim = 4, 64
    weight = _randn(gen, dim, width, dtype=dtype, dev=dev)
    bias = _randn(gen, dim, dtype=dtype, dev=dev)
    states = torch.zeros(4, dim, width - 1, dtype=dtype, device=dev)
    states[3] = _randn(gen, dim, width - 1, dtype=dtype, dev=dev)
    x = _randn(gen, dim, 9, dtype=dtype, dev=dev)
    rows = torch.tensor([1, 3], dtype=torch.int32).to(dev)
    out = ops.npu_causal_conv1d(x, weight, bias, states,
                                torch.tensor([0, 5, 9], dtype=torch.int32).to(dev), rows,
                                torch.tensor([False, True]).to(dev), "silu")
    step = ops.npu_causal_conv1d_update(_randn(gen, 2, dim, dtype=dtype, dev=dev), states,
                                        weight, bias, "silu", rows)
    return [out, step, states]


def _ssd(ops, dev, dtype, gen):
    """Mamba-2: a 2-request prefill across chunks, then one decode step each."""
    heads, head_dim, groups, n = 4, 16, 2, 16
    state = torch.zeros(3, heads, head_dim, n, dtype=torch.float32, device=dev)
    a = -torch.linspace(0.5, 2.0, heads).to(dev)
    d, dt_bias = torch.ones(heads).to(dev), torch.zeros(heads).to(dev)
    x = _randn(gen, 40, heads, head_dim, dtype=dtype, dev=dev)
    b, c = (_randn(gen, 40, groups, n, dtype=dtype, dev=dev) for _ in range(2))
    dt = _randn(gen, 40, heads, dtype=dtype, dev=dev)
    out = torch.empty_like(x)
    finals = ops.npu_mamba_chunk_scan(x, dt, a, b, c, 16, d, dt_bias,
                                      torch.tensor([0, 25, 40], dtype=torch.int32).to(dev),
                                      None, True, out)
    state[1:] = finals
    step = torch.empty(2, heads, head_dim, dtype=dtype, device=dev)
    ops.npu_selective_state_update(state, x[:2], dt[:2], a, b[:2], c[:2], d, dt_bias, True,
                                   torch.tensor([1, 2], dtype=torch.int32).to(dev), step)
    return [out, finals, step, state]


def _gdn(ops, dev, dtype, gen):
    """Gated DeltaNet: a 2-request prefill over more than one chunk, then one decode step."""
    hk, hv, dk, dv = 2, 4, 32, 32
    unit = lambda *s: torch.nn.functional.normalize(  # noqa: E731
        torch.randn(*s, generator=gen), dim=-1).to(dtype).to(dev)
    q, k = unit(80, hk, dk), unit(80, hk, dk)
    v = _randn(gen, 80, hv, dv, dtype=dtype, dev=dev)
    beta = torch.sigmoid(torch.randn(80, hv, generator=gen)).to(dtype).to(dev)
    g = (-torch.rand(80, hv, generator=gen) * 0.2).to(dev)
    state = torch.zeros(3, hv, dv, dk, dtype=torch.float32, device=dev)
    out, finals = ops.npu_chunk_gated_delta_rule(q, k, v, beta=beta, initial_state=state[1:],
                                                 actual_seq_lengths=[70, 10], scale=dk ** -0.5,
                                                 g=g)
    state[1:] = finals
    step = ops.npu_recurrent_gated_delta_rule(
        q[:2], k[:2], v[:2], state, beta=beta[:2], scale=dk ** -0.5,
        ssm_state_indices=torch.tensor([1, 2], dtype=torch.int32).to(dev), g=g[:2])
    return [out, finals, step, state]


def _batch_memcpy(ops, dev, dtype, gen):
    src = _randn(gen, 64, dtype=dtype, dev=dev)
    dst = torch.zeros(64, dtype=dtype, device=dev)
    size = src.element_size()
    ops.npu_batch_memcpy(torch.tensor([src.data_ptr(), src.data_ptr() + 40 * size]),
                         torch.tensor([dst.data_ptr() + 8 * size, dst.data_ptr()]),
                         torch.tensor([16 * size, 4 * size]))
    return [dst]


def _indexer_cache(ops, dev, dtype, gen):
    cache = torch.zeros(3, 16, 1, 128, dtype=dtype, device=dev)
    rows = _randn(gen, 5, 1, 128, dtype=dtype, dev=dev)
    ops._npu_reshape_and_cache_siso(rows, cache, torch.tensor([3, -1, 40, 17, 0],
                                                              dtype=torch.int32).to(dev))
    return [cache]


def _sparse_mla(ops, dev, dtype, gen):
    """DeepSeek-V3.2: the indexer picks 8 keys per token of a prefill (20 new tokens over
    35 keys) and a decode (1 over 50); sparse MLA attends them on the latent cache."""
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32).to(dev)  # noqa: E731
    table, q_ends, kv_lens = i32([0, 1, 0, 0], [2, 3, 4, 1]), i32(20, 21), i32(35, 50)
    index_keys = _randn(gen, 5, 16, 1, 128, dtype=dtype, dev=dev)
    picked, _ = ops.npu_lightning_indexer(
        _randn(gen, 21, 8, 128, dtype=dtype, dev=dev), index_keys,
        _randn(gen, 21, 8, dtype=dtype, dev=dev), actual_seq_lengths_query=q_ends,
        actual_seq_lengths_key=kv_lens, block_table=table, layout_query="TND",
        layout_key="PA_BSND", sparse_count=8, sparse_mode=3)
    latent = _randn(gen, 5, 16, 1, 512, dtype=dtype, dev=dev)
    out, _, _ = ops.npu_sparse_flash_attention(
        _randn(gen, 21, 4, 512, dtype=dtype, dev=dev, scale=0.05), latent, latent,
        picked, 0.1, block_table=table, actual_seq_lengths_query=q_ends,
        actual_seq_lengths_kv=kv_lens,
        query_rope=_randn(gen, 21, 4, 64, dtype=dtype, dev=dev, scale=0.05),
        key_rope=_randn(gen, 5, 16, 1, 64, dtype=dtype, dev=dev), sparse_block_size=1,
        layout_query="TND", layout_kv="PA_BSND", sparse_mode=3, attention_mode=2)
    # the picks as sorted sets (the kernel's order within a row is undocumented)
    return [picked.sort(dim=-1).values.float(), out]


def _vision_unpad(ops, dev, dtype, gen):
    """A ViT block's attention: an image's windows packed in one row, grouped heads."""
    q = _randn(gen, 80, 8, 64, dtype=dtype, dev=dev)
    k, v = (_randn(gen, 80, 4, 64, dtype=dtype, dev=dev) for _ in range(2))
    out = torch.empty_like(q)
    ops._npu_flash_attention_unpad(q, k, v, torch.tensor([16, 16, 16, 32], dtype=torch.int32),
                                   0.125, 8, 4, out)
    return [out]


def _graph_round_trip(ops, dev, dtype, gen, backend):
    """Capture a paged-attention task at lengths A, update it to B, replay: equals eager B.
    The plugin's protocol (compilation/acl_graph.py): the replay waits on an ExternalEvent
    captured into the graph (wait, reset), which the update records on its stream."""
    args = _paged_args(gen, dtype, dev, [300, 17])
    longest = torch.full((2,), 3 * 128, dtype=torch.int32)
    workspace = ops._npu_paged_attention_get_workspace(**{**args, "context_lens": longest})
    graph, event = backend.new_graph(), backend.new_event()
    with backend.capture(graph, backend.graph_pool_handle()):
        stream = backend.current_stream()
        event.wait(stream)
        event.reset(stream)
        backend.task_group_begin(stream)
        ops._npu_paged_attention(**args, workspace=workspace)
        handle = backend.task_group_end(stream)
    new_lens = torch.tensor([129, 383], dtype=torch.int32)
    update_stream = backend.new_stream()
    with backend.stream(update_stream):
        backend.task_update_begin(update_stream, handle)
        ops._npu_paged_attention(**{**args, "context_lens": new_lens}, workspace=workspace)
        backend.task_update_end(update_stream)
        event.record(update_stream)
    graph.replay()
    replayed = args["out"].clone()
    eager = dict(args, context_lens=new_lens, out=torch.empty_like(args["out"]))
    ops._npu_paged_attention(**eager)
    return [replayed, replayed - eager["out"]]  # the second must be zero on both sides


CASES = [
    Case("npu_rms_norm", _rms_norm),
    Case("npu_add_rms_norm", _add_rms_norm),
    Case("npu_rotary_mul[half]", _rotary("half")),
    Case("npu_rotary_mul[interleave]", _rotary("interleave")),
    Case("npu_swiglu", _swiglu),
    Case("npu_clipped_swiglu", _clipped_swiglu),
    Case("npu_fused_infer_attention_score", _fia),
    Case("npu_fused_infer_attention_score_out", _fia_out_case(sinks=False)),
    Case("npu_fused_infer_attention_score_v2_out[sinks, band]", _fia_out_case(sinks=True)),
    Case("_npu_paged_attention", _paged_attention),
    Case("_npu_reshape_and_cache", _reshape_and_cache, atol=0.0),
    Case("_npu_reshape_and_cache[mla planes]", _reshape_and_cache_mla, atol=0.0),
    Case("npu_multi_head_latent_attention", _mla_decode),
    Case("npu_multi_head_latent_attention[lse, empty shard]", _mla_decode_lse),
    Case("npu_fused_infer_attention_score[dense TND 192/128, MLA prefill]",
         _mla_prefill_dense),
    Case("npu_fused_infer_attention_score[MLA form, padded heads, drafts]", _mla_form_drafts),
    Case("npu_attention_update", _attention_update),
    Case("npu_moe_gating_top_k", _gating_top_k),
    Case("npu_moe_init_routing_v2+npu_grouped_matmul+npu_moe_token_unpermute", _moe_pipeline),
    Case("npu_grouped_matmul[one group, cumsum]", _one_group),
    # int8 codes may differ by one where x / scale lands on .5 (rounding mode unverified)
    Case("npu_quantize+npu_quant_matmul[static]", _quant_static, atol=1.0),
    Case("npu_dynamic_quant+npu_quant_matmul[pertoken]", _quant_dynamic, atol=1.0),
    Case("npu_dynamic_quant+npu_grouped_matmul[pertoken int8]", _quant_grouped, atol=1.0),
    Case("npu_sgmv_shrink+npu_sgmv_expand+npu_bgmv_shrink+npu_bgmv_expand", _lora),
    Case("npu_causal_conv1d+npu_causal_conv1d_update", _conv1d),
    Case("npu_mamba_chunk_scan+npu_selective_state_update", _ssd),
    Case("npu_chunk_gated_delta_rule+npu_recurrent_gated_delta_rule", _gdn),
    Case("npu_batch_memcpy", _batch_memcpy, atol=0.0),
    Case("_npu_reshape_and_cache_siso", _indexer_cache, atol=0.0),
    Case("npu_lightning_indexer+npu_sparse_flash_attention", _sparse_mla),
    Case("_npu_flash_attention_unpad", _vision_unpad),
]
GRAPH_CASE = "graph:paged_attention capture/update/replay"


def _compare(sim: list, dev: list, atol: float) -> tuple[float, str]:
    worst, note = 0.0, "ok"
    if len(sim) != len(dev):
        return float("inf"), f"{len(sim)} outputs vs {len(dev)}"
    for i, (a, b) in enumerate(zip(sim, dev)):
        b = b.cpu()
        if a.shape != b.shape or a.dtype != b.dtype:
            return float("inf"), f"output {i}: {a.dtype}{tuple(a.shape)} vs " \
                                 f"{b.dtype}{tuple(b.shape)}"
        diff = (a.double() - b.double()).abs().nan_to_num(float("inf"))
        err = float(diff.max()) if diff.numel() else 0.0
        if err > atol:
            note = f"output {i} differs by {err:.3g} (atol {atol})"
        worst = max(worst, err)
    return worst, note


def _run_side(case_run, ops, dev, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return [t.detach() for t in case_run(ops, dev, dtype, gen)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="run the simulated side only (no NPU needed)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)

    from vllm_npu import ops as surface
    from vllm_npu.compilation.graph_backend import SimGraphBackend
    from vllm_npu.ops import sim

    covered = {part.split("[")[0] for c in CASES for part in c.name.split("+")}
    missing = sorted(set(surface.OP_NAMES) - covered - {
        "_npu_fused_infer_attention_score_get_max_workspace",  # used by the .out case
        "_npu_fused_infer_attention_score_v2_get_max_workspace",  # by the v2 .out case
        "_npu_paged_attention_get_workspace"})                 # used by the paged case
    if missing:
        print(f"ops without a conformance case: {missing}", file=sys.stderr)
        return 1
    device = None
    if not args.dry_run:
        try:
            from vllm_npu.compilation.graph_backend import NPUGraphBackend
            from vllm_npu.ops import device_ops
            device = (device_ops, torch.device("npu:0"), NPUGraphBackend())
        except Exception as e:  # noqa: BLE001 - torch_npu / CANN absent: say so, stop
            print(f"no Ascend NPU here ({type(e).__name__}: {e}); use --dry-run to run "
                  "the simulated side only", file=sys.stderr)
            return 2
    rows, failed = [], 0
    cases = [(c.name, c.run, c.atol) for c in CASES]
    cases.append((GRAPH_CASE, None, 2e-2))
    for seed, (name, run, atol) in enumerate(cases):
        if run is None:  # the graph round trip, on each side's graph runtime
            def sim_run(o, d, t, g):
                return _graph_round_trip(o, d, t, g, SimGraphBackend())

            def dev_run(o, d, t, g):
                return _graph_round_trip(o, d, t, g, device[2])
        else:
            sim_run = dev_run = run
        try:
            got_sim = _run_side(sim_run, sim, torch.device("cpu"), dtype, seed)
        except Exception as e:  # noqa: BLE001 - reported in the table
            rows.append((name, "sim failed", f"{type(e).__name__}: {e}"))
            failed += 1
            continue
        if run is None and float(got_sim[1].abs().max()) != 0.0:
            rows.append((name, "sim failed", "the replay differs from the eager call"))
            failed += 1
            continue
        if device is None:
            rows.append((name, "-", f"sim ok ({len(got_sim)} outputs)"))
            continue
        try:
            got_dev = _run_side(dev_run, device[0], device[1], dtype, seed)
        except Exception as e:  # noqa: BLE001 - a device refusal is a finding too
            rows.append((name, "device failed", f"{type(e).__name__}: {e}"))
            failed += 1
            continue
        err, note = _compare(got_sim, got_dev, atol)
        failed += note != "ok"
        rows.append((name, f"{err:.3g}", note))
    print("| case | max abs diff | result |")
    print("|---|---:|---|")
    for name, err, note in rows:
        print(f"| {name} | {err} | {note} |")
    print(f"\n{len(rows) - failed}/{len(rows)} cases agree"
          + (" (simulated side only)" if device is None else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
