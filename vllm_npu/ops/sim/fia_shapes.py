"""The head-dim, head-count and dtype rules of `npu_fused_infer_attention_score` (v1 and
v2) that depend on its form, and of the ATB MLA decode op. Where the documents and the
kernel code disagree the simulator takes the stricter reading (docs/device.md).

Sources: op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score
.md "TND布局约束" (v1) and the _v2 page; CANN ops-transformer prompt_flash_attention_tiling
.cpp `CheckInputShapeWhenLayoutIsTND`, fused_infer_attention_score_tiling_check_feature.cpp,
incre_flash_attention_tiling_check.cpp; ATB multi_latent_attention_operation.cpp.
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.checks import NPUOpError

# Dense TND (no block table, no rope): (query/key D, value D). "Q_D, K_D, V_D = 128, or
# Q_D, K_D = 192 and V_D = 128 or 192"; "When G not 1, valueD should not be 192".
DENSE_TND_DIMS = ((128, 128), (192, 128), (192, 192))
# The MLA form (query_rope): "query's D only supports 512 or 128"; with D 512 "query N
# 1/2/4/8/16/32/64/128 ... key N=1", rope D 64 (IFA tiling: "MLA only support {1, 2, 4,
# 8, 16, 32, 64, 128}", "headDimRope only support 64").
MLA_FORM_HEADS = (1, 2, 4, 8, 16, 32, 64, 128)
MLA_ROPE_DIM = 64
# ATB MultiLatentAttention (decode): headNum {8,16,32,64,128}, kvHeadNum 1, head size 512,
# rope 64, "decoder blockSize should be 128".
ATB_MLA_HEADS = (8, 16, 32, 64, 128)
ATB_MLA_LATENT, ATB_MLA_ROPE, ATB_MLA_BLOCK = 512, 64, 128


def check_dense_tnd(op: str, dtype: torch.dtype, heads: int, kv_heads: int, qk_dim: int,
                    v_dim: int) -> None:
    """TND without a block table or rope runs the prompt-flash kernel's TND path."""
    if (qk_dim, v_dim) not in DENSE_TND_DIMS or (v_dim == 192 and heads != kv_heads):
        raise NPUOpError(f"{op}: dense TND takes query/key/value head dims (128, 128, 128) "
                         "or (192, 192, 128 / 192; 192 without grouped heads), got "
                         f"({qk_dim}, {qk_dim}, {v_dim}) with {heads} / {kv_heads} heads")
    # "When layout is TND, inputDataType should be bf16" (the kernel; the v2 doc also lets
    # float16 MHA through); float32 is the simulator's parity extension
    if dtype not in (torch.bfloat16, torch.float32):
        raise NPUOpError(f"{op}: dense TND takes bfloat16, got {dtype} (vllm-ascend casts "
                         "its MLA prefill to bfloat16)")


def check_mla_form(op: str, heads: int, kv_heads: int, qk_dim: int, rope_dim: int) -> None:
    if rope_dim != MLA_ROPE_DIM or qk_dim not in (512, 128):
        raise NPUOpError(f"{op}: the MLA form (query_rope) takes query D 512 or 128 and rope "
                         f"D {MLA_ROPE_DIM}, got D {qk_dim}, rope {rope_dim}")
    if qk_dim == 512 and (kv_heads != 1 or heads not in MLA_FORM_HEADS):
        raise NPUOpError(f"{op}: the MLA form with D 512 takes one kv head and query heads "
                         f"in {list(MLA_FORM_HEADS)}, got {heads} / {kv_heads}")


def check_atb_mla(op: str, heads: int, latent: int, rope: int, block_size: int) -> None:
    if heads not in ATB_MLA_HEADS:
        raise NPUOpError(f"{op}: headNum {heads}; ATB MLA takes {list(ATB_MLA_HEADS)} "
                         "(pad the query heads)")
    if (latent, rope) != (ATB_MLA_LATENT, ATB_MLA_ROPE):
        raise NPUOpError(f"{op}: ATB MLA takes a latent of {ATB_MLA_LATENT} and rope of "
                         f"{ATB_MLA_ROPE}, got {latent} / {rope}")
    if block_size != ATB_MLA_BLOCK:
        raise NPUOpError(f"{op}: ATB MLA decode takes block_size {ATB_MLA_BLOCK}, got "
                         f"{block_size}")
