"""Simulated ATB MLA decode, `npu_multi_head_latent_attention`: split nope/rope inputs,
optionally an lse output (for decode context parallelism).

One layer's latent cache as two planes (`vllm_npu.kv_layout.latent_planes`; the new rows
are written with `_npu_reshape_and_cache`, K = nope, V = rope):

    ctkv   [num_blocks, block_size, 1, L]      L = kv_lora_rank
    k_rope [num_blocks, block_size, 1, R]      R = qk_rope_head_dim
    slot s -> block s // block_size, offset s % block_size, in both

Decode reads both planes as keys (all L + R features) and the nope plane as values: with
the absorbed query [q_nope @ W_UK | q_pe], attention returns softmax(q . row) @ ctkv per
head. Signature after torch_npu's ATB binding (`torch_npu.atb.npu_multi_head_latent_attention`);
limits after CANN ATB MultiLatentAttentionOperation (ascendtb_01_0195; ATB
multi_latent_attention_operation.cpp, fia_shapes.py): MQA only (one kv head), L 512 and R
64, headNum in {8, 16, 32, 64, 128}, block_size 128, float16/bfloat16 (float32:
simulation only), and every input a dense ND tensor.
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim import paged_decode
from vllm_npu.ops.sim.attend import attend_padded, gather_paged
from vllm_npu.ops.sim.checks import NPUOpError, check_contiguous, check_dim, check_dtype
from vllm_npu.ops.sim.fia_shapes import check_atb_mla

MLA_MAX_BATCH = 8192
_INT_MAX = 2147483647


_MLA_CALC_TYPES = (None, "calc_type_undefined", "calc_type_ring")


def npu_multi_head_latent_attention(q_nope: torch.Tensor, q_rope: torch.Tensor,
                                    ctkv: torch.Tensor, k_rope: torch.Tensor,
                                    block_tables: torch.Tensor, context_lens,
                                    q_headnum: int, qk_scale: float, kv_headnum: int, *,
                                    calc_type: str | None = None, return_lse: bool = False,
                                    output: torch.Tensor | None = None,
                                    lse: torch.Tensor | None = None, **unsupported):
    """ATB MLA decode with split inputs ("krope_ctkv"), one query token per request.

    q_nope [B, N, L], q_rope [B, N, R]; ctkv [num_blocks, bs, 1, L], k_rope
    [num_blocks, bs, 1, R], all contiguous (ATB takes dense ND tensors; torch_npu would
    copy a strided view whole, e.g. the nope half of a merged [.., L+R] cache, on every
    call); context_lens: host ints [B], each request's kv length,
    0 allowed (a context-parallel rank holding none of the request: output 0, lse -inf).
    scores = (q_nope . ctkv + q_rope . k_rope) * qk_scale; output = softmax @ ctkv
    [B, N, L]. With calc_type "calc_type_ring" and return_lse, also lse [B, N, 1] in the
    query dtype, as the device writes it.
    """
    op = "npu_multi_head_latent_attention"
    used = {k: v for k, v in unsupported.items() if v is not None}
    if used:
        raise NotImplementedError(f"{op}: the simulator does not implement {sorted(used)}")
    if calc_type not in _MLA_CALC_TYPES:
        raise NPUOpError(f"{op}: calc_type={calc_type!r}; valid: {_MLA_CALC_TYPES}")
    if return_lse and calc_type != "calc_type_ring":
        raise NPUOpError(f"{op}: return_lse needs calc_type='calc_type_ring'")
    for name, t in (("q_nope", q_nope), ("q_rope", q_rope), ("ctkv", ctkv),
                    ("k_rope", k_rope)):
        check_dtype(op, name, t)
        if t.dtype != q_nope.dtype:
            raise NPUOpError(f"{op}: {name} dtype {t.dtype} != q_nope dtype {q_nope.dtype}")
    check_dim(op, "q_nope", q_nope, 3)
    check_dim(op, "ctkv", ctkv, 4)
    check_contiguous(op, q_nope=q_nope, q_rope=q_rope, ctkv=ctkv, k_rope=k_rope)
    B, N, L = q_nope.shape
    R = q_rope.shape[-1]
    nb, bs = ctkv.shape[:2]
    if kv_headnum != 1 or N != q_headnum:
        raise NPUOpError(f"{op}: MQA only (kv_headnum=1) with q_headnum={N}; got "
                         f"kv_headnum={kv_headnum}, q_headnum={q_headnum}")
    if q_rope.shape != (B, N, R) or ctkv.shape != (nb, bs, 1, L) \
            or k_rope.shape != (nb, bs, 1, R):
        raise NPUOpError(f"{op}: shapes q_nope {tuple(q_nope.shape)}, q_rope "
                         f"{tuple(q_rope.shape)}, ctkv {tuple(ctkv.shape)}, k_rope "
                         f"{tuple(k_rope.shape)} do not fit [B, N, L] / [B, N, R] / "
                         "[blocks, bs, 1, L] / [blocks, bs, 1, R]")
    check_atb_mla(op, N, L, R, bs)
    if B > MLA_MAX_BATCH:
        raise NPUOpError(f"{op}: batch {B} exceeds {MLA_MAX_BATCH}")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 \
            or block_tables.shape[0] != B:
        raise NPUOpError(f"{op}: block_tables must be int32 [B={B}, max_blocks], got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")
    lens = [int(n) for n in context_lens]
    if len(lens) != B or any(n < 0 or n > block_tables.shape[1] * bs for n in lens):
        raise NPUOpError(f"{op}: context_lens must be {B} host ints in [0, "
                         f"{block_tables.shape[1] * bs}], got {lens}")
    if output is not None and (output.shape != (B, N, L) or output.dtype != q_nope.dtype):
        raise NPUOpError(f"{op}: output must be [{B}, {N}, {L}] {q_nope.dtype}")
    if lse is not None and (lse.shape != (B, N, 1) or lse.dtype != q_nope.dtype):
        raise NPUOpError(f"{op}: lse must be [{B}, {N}, 1] {q_nope.dtype}")
    if paged_decode.supports(ctkv, k_rope):
        o, lse_rows = paged_decode.paged_decode(q_nope, ctkv, ctkv, 1, block_tables,
                                                torch.tensor(lens), float(qk_scale),
                                                query_rope=q_rope, key_rope=k_rope)
    else:
        max_len = max(lens, default=0)
        c = gather_paged(ctkv.reshape(nb, bs, L), block_tables, 1, max_len)  # [B, K, 1, L]
        r = gather_paged(k_rope.reshape(nb, bs, R), block_tables, 1, max_len)
        o, lse_rows = attend_padded(torch.cat((q_nope, q_rope), dim=-1).unsqueeze(1),
                                    torch.cat((c, r), dim=-1), c,
                                    torch.ones(B, dtype=torch.long), torch.tensor(lens),
                                    float(qk_scale), True, _INT_MAX, 0, want_lse=return_lse)
        o, lse_rows = o[:, 0], lse_rows[:, 0] if return_lse else None
    out = o if output is None else output.copy_(o)
    if not return_lse:
        return out
    lse_out = lse_rows.unsqueeze(-1).to(q_nope.dtype)
    if lse is not None:
        lse.copy_(lse_out)
        lse_out = lse
    return out, lse_out
