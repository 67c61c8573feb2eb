"""Simulated int8 quantisation ops: `npu_quantize`, `npu_dynamic_quant`, `npu_quant_matmul`.

Semantics and the argument rules the device enforces, from the torch_npu API reference
(hiascend "ptaoplist" pages for npu_quantize / npu_dynamic_quant / npu_quant_matmul) and
CANN's aclnnAscendQuantV3 / aclnnDynamicQuant / aclnnQuantMatmulV4:

    npu_quantize       y = round(x / scales + zero_points)   (div_mode=True: aclnnQuantize)
                       y = round(x * scales + zero_points)   (div_mode=False), int8 saturated
                       scales in x's dtype on both paths (see _check_div_mode_dtypes)
    npu_dynamic_quant  per row (token): scale = max|x| / 127; y = round(x / scale) (symmetric)
    npu_quant_matmul   acc = x1 @ x2 in int32;  int32 bias added to acc;  out = acc * scale
                       (* pertoken_scale per row) (+ float bias) (+ offset for int8 output)

An int64 `scale` carries float32 bits in its low 32 bits (ModelSlim's `deq_scale` for fp16
models, `npu_trans_quant_param`'s output). Rounding is half-to-even (torch.round); the
device's "Round" mode is not documented more precisely. float32 activations / outputs are
a simulation-only extension (exact parity tests), as for the other simulated ops.
"""
from __future__ import annotations

import torch

from vllm_npu.ops.sim.checks import DEVICE_FLOAT_DTYPES, NPUOpError, check_dtype

INT8_MIN, INT8_MAX = -128, 127


def _saturate_int8(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)


def npu_quantize(input: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                 dtype: torch.dtype, axis: int = 1, div_mode: bool = True) -> torch.Tensor:
    op = "npu_quantize"
    check_dtype(op, "input", input)
    if dtype != torch.qint8:
        raise NotImplementedError(f"{op}: the simulator implements dtype=torch.qint8 only, "
                                  f"got {dtype}")
    if scales.dim() != 1:
        raise NPUOpError(f"{op}: scales must be 1-D, got shape {tuple(scales.shape)}")
    dim = axis if axis >= 0 else input.dim() + axis
    if not 0 <= dim < input.dim() or scales.numel() not in (1, input.shape[dim]):
        raise NPUOpError(f"{op}: scales of {scales.numel()} elements for axis {axis} of input "
                         f"{tuple(input.shape)}; valid: 1 or the axis size")
    if zero_points is not None and zero_points.shape != scales.shape:
        raise NPUOpError(f"{op}: zero_points {tuple(zero_points.shape)} must match scales "
                         f"{tuple(scales.shape)}")
    if div_mode:
        _check_div_mode_dtypes(op, input, scales, zero_points)
    else:
        if axis not in (-1, -2, input.dim() - 1, input.dim() - 2):
            raise NPUOpError(f"{op}: div_mode=False takes axis -1 or -2, got {axis}")
        if scales.dtype != input.dtype:  # torch_npu 2.5+ doc: scales in input's dtype
            raise NPUOpError(f"{op}: div_mode=False needs scales in the input's dtype "
                             f"{input.dtype}, got {scales.dtype}")
        if zero_points is not None and zero_points.dtype != scales.dtype:
            raise NPUOpError(f"{op}: div_mode=False needs zero_points in the scales' dtype "
                             f"{scales.dtype}, got {zero_points.dtype}")
    shape = [1] * input.dim()
    shape[dim] = scales.numel()
    s = scales.float().view(shape)
    x = input.float()
    y = x / s if div_mode else x * s
    if zero_points is not None:
        y = y + zero_points.float().view(shape)
    return _saturate_int8(y)


_DIV_ZERO_POINTS = (torch.int8, torch.uint8, torch.int32)


def _check_div_mode_dtypes(op, input, scales, zero_points) -> None:
    """div_mode=True is aclnnQuantize. Its scales: float32 or bfloat16 (torch_npu's
    npu_quantize page, Atlas A2/A3), and in x's dtype unless x is float32 (CANN ops-nn
    aclnnQuantize.md); bfloat16 x takes bfloat16 scales and zero points (CANN 8.0.0
    aclnnQuantize). The stricter reading of both leaves no scale dtype for a float16 x:
    float16 models quantise with div_mode=False (as vllm-ascend's quant_per_tensor does)."""
    if input.dtype == torch.float16:
        raise NPUOpError(f"{op}: div_mode=True takes no float16 input (its scales must be "
                         "float32 / bfloat16 and in the input's dtype); quantise float16 "
                         "with div_mode=False and scales in float16")
    if scales.dtype != input.dtype:
        raise NPUOpError(f"{op}: div_mode=True needs scales in the input's dtype "
                         f"{input.dtype}, got {scales.dtype}")
    if zero_points is None:
        return
    allowed = (torch.bfloat16,) if input.dtype == torch.bfloat16 else _DIV_ZERO_POINTS
    if zero_points.dtype not in allowed:
        raise NPUOpError(f"{op}: div_mode=True with {input.dtype} input takes zero_points "
                         f"in {list(allowed)}, got {zero_points.dtype}")


def npu_dynamic_quant(input: torch.Tensor, *, smooth_scales: torch.Tensor | None = None,
                      group_index: torch.Tensor | None = None,
                      dst_type: torch.dtype | None = None):
    op = "npu_dynamic_quant"
    check_dtype(op, "input", input)
    if input.dim() < 2:
        raise NPUOpError(f"{op}: input needs >= 2 dims, got shape {tuple(input.shape)}")
    if group_index is not None:
        raise NotImplementedError(f"{op}: the simulator does not implement group_index")
    if dst_type not in (None, torch.int8):
        raise NotImplementedError(f"{op}: the simulator implements dst_type int8 only, got "
                                  f"{dst_type}")
    x = input.float()
    if smooth_scales is not None:
        if smooth_scales.shape != (input.shape[-1],):
            raise NPUOpError(f"{op}: smooth_scales must be [{input.shape[-1]}], got "
                             f"{tuple(smooth_scales.shape)}")
        x = x * smooth_scales.float()
    scale = x.abs().amax(dim=-1) / INT8_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays 0
    return _saturate_int8(x / safe.unsqueeze(-1)), scale


def decode_scale(scale: torch.Tensor) -> torch.Tensor:
    """The float32 values of a quant-matmul scale (int64: float32 bits in the low word)."""
    if scale.dtype == torch.int64:
        return (scale & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    return scale.float()


_OUTPUTS = DEVICE_FLOAT_DTYPES + (torch.int8,)


def _check_quant_matmul(op, x1, x2, scale, offset, pertoken_scale, bias, out_dtype) -> None:
    for name, t in (("x1", x1), ("x2", x2)):
        if t.dtype != torch.int8:
            raise NPUOpError(f"{op}: {name} must be int8, got {t.dtype}")
    if x2.dim() != 2 or x1.dim() < 2 or x1.shape[-1] != x2.shape[0]:
        raise NPUOpError(f"{op}: x1 [..., m, k] and x2 [k, n] needed, got {tuple(x1.shape)} / "
                         f"{tuple(x2.shape)}")
    n = x2.shape[1]
    if out_dtype not in _OUTPUTS + (torch.float32,):
        raise NPUOpError(f"{op}: output_dtype {out_dtype}; supported: {list(_OUTPUTS)}")
    if scale.dim() != 1 or scale.numel() not in (1, n):
        raise NPUOpError(f"{op}: scale must be [1] or [n={n}], got {tuple(scale.shape)}")
    if scale.dtype not in (torch.int64, torch.float32, torch.bfloat16):
        raise NPUOpError(f"{op}: scale dtype {scale.dtype}; supported: int64, float32, bfloat16")
    if bias is not None and bias.shape != (n,):
        raise NPUOpError(f"{op}: bias must be [n={n}], got {tuple(bias.shape)}")
    if pertoken_scale is not None:
        rows = x1.shape[:-1].numel()
        if pertoken_scale.dtype != torch.float32 or pertoken_scale.numel() != rows:
            raise NPUOpError(f"{op}: pertoken_scale must be float32 [m={rows}], got "
                             f"{pertoken_scale.dtype} {tuple(pertoken_scale.shape)}")
    # The allowed combinations (aclnnQuantMatmulV4 on Atlas A2/A3).
    bias_dtype = None if bias is None else bias.dtype
    why = None
    if offset is not None and out_dtype != torch.int8:
        why = "offset is taken with int8 output only"
    elif scale.dtype == torch.int64 and (out_dtype not in (torch.float16, torch.int8)
                                         or pertoken_scale is not None):
        why = "an int64 scale goes with float16/int8 output and no pertoken_scale"
    elif scale.dtype == torch.bfloat16 and out_dtype != torch.bfloat16:
        why = "a bfloat16 scale goes with bfloat16 output"
    elif out_dtype == torch.int8 and (pertoken_scale is not None
                                      or bias_dtype not in (None, torch.int32)):
        why = "int8 output takes an int32 bias and no pertoken_scale"
    elif out_dtype == torch.float16 and pertoken_scale is None \
            and bias_dtype not in (None, torch.int32):
        why = "float16 output without pertoken_scale takes an int32 bias"
    elif out_dtype == torch.float16 and pertoken_scale is not None \
            and scale.dtype != torch.float32:
        why = "float16 output with pertoken_scale needs a float32 scale"
    elif out_dtype == torch.bfloat16 and bias_dtype not in (None, torch.int32, torch.bfloat16,
                                                            torch.float32):
        why = f"bfloat16 output takes an int32/bfloat16/float32 bias, not {bias_dtype}"
    elif out_dtype == torch.float32 and bias_dtype not in (None, torch.int32, torch.float32):
        why = f"float32 output (simulator) takes an int32/float32 bias, not {bias_dtype}"
    if why:
        raise NPUOpError(f"{op}: {why} (scale {scale.dtype}, output {out_dtype}, bias "
                         f"{bias_dtype}, pertoken_scale "
                         f"{'given' if pertoken_scale is not None else 'None'})")


def npu_quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, *,
                     offset: torch.Tensor | None = None,
                     pertoken_scale: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None,
                     output_dtype: torch.dtype | None = None) -> torch.Tensor:
    op = "npu_quant_matmul"
    out_dtype = output_dtype or torch.int8
    _check_quant_matmul(op, x1, x2, scale, offset, pertoken_scale, bias, out_dtype)
    # int32 accumulation, exact (float64 holds every int8 x int8 sum of this size exactly)
    acc = (x1.double() @ x2.double())
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + bias.double()
    y = acc.float() * decode_scale(scale)
    if pertoken_scale is not None:
        y = y * pertoken_scale.reshape(*x1.shape[:-1], 1)
    if bias is not None and bias.dtype != torch.int32:
        y = y + bias.float()
    if out_dtype == torch.int8:
        if offset is not None:
            y = y + offset.float()
        return _saturate_int8(y)
    return y.to(out_dtype)
