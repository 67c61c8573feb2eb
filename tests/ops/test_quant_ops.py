"""Simulated int8 quantisation ops vs integer reference math written out per element, and
the argument combinations the device refuses."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.ops.sim import npu_dynamic_quant, npu_quant_matmul, npu_quantize
from vllm_npu.ops.sim.checks import NPUOpError


def _round_half_even(v: float) -> int:
    return int(torch.tensor(v, dtype=torch.float64).round())


def _sat(v: int) -> int:
    return max(-128, min(127, v))


@pytest.mark.parametrize("div_mode", [True, False])
def test_quantize_per_channel_with_offsets_and_saturation(div_mode):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 6, generator=g) * 40
    x[0, 0], x[1, 1] = 1e4, -1e4  # saturate at +127 / -128
    scales = torch.rand(6, generator=g) + 0.2
    # zero points: integers for aclnnQuantize (div_mode=True), in x's dtype otherwise
    zp = torch.randint(-3, 4, (6,), generator=g, dtype=torch.int32)
    zp = zp if div_mode else zp.float()
    y = npu_quantize(x, scales, zp, torch.qint8, -1, div_mode)
    assert y.dtype == torch.int8
    for i in range(5):
        for j in range(6):
            v = float(x[i, j]) / float(scales[j]) if div_mode else float(x[i, j]) * float(scales[j])
            assert int(y[i, j]) == _sat(_round_half_even(v + float(zp[j]))), (i, j)
    assert int(y[0, 0]) == (127 if div_mode or scales[0] > 0 else -128)


@pytest.mark.parametrize("x_dtype,scales,zero_points,div_mode,match", [
    # div_mode=True (aclnnQuantize): scales in x's dtype; bf16 x: bf16 zero points too
    (torch.bfloat16, torch.float32, torch.int32, True, "scales in the input's dtype"),
    (torch.bfloat16, torch.bfloat16, torch.int32, True, "zero_points in"),
    (torch.float16, torch.float32, None, True, "takes no float16 input"),
    (torch.float16, torch.float16, None, True, "takes no float16 input"),
    (torch.float32, torch.bfloat16, None, True, "scales in the input's dtype"),
    (torch.float32, torch.float32, torch.float32, True, "zero_points in"),
    # div_mode=False: scales (and zero points) in x's dtype
    (torch.bfloat16, torch.float32, None, False, "scales in the input's dtype"),
    (torch.float16, torch.float16, torch.int32, False, "zero_points in the scales' dtype"),
])
def test_quantize_refuses_the_dtype_pairs_the_device_refuses(x_dtype, scales, zero_points,
                                                             div_mode, match):
    zp = None if zero_points is None else torch.zeros(4, dtype=zero_points)
    with pytest.raises(NPUOpError, match=match):
        npu_quantize(torch.ones(2, 4, dtype=x_dtype), torch.ones(4, dtype=scales), zp,
                     torch.qint8, -1, div_mode)


@pytest.mark.parametrize("x_dtype,zero_points,div_mode", [
    (torch.bfloat16, torch.bfloat16, True),   # CANN 8.0.0 aclnnQuantize's bf16 form
    (torch.float32, torch.int32, True),
    (torch.bfloat16, torch.bfloat16, False),  # vllm-ascend's quant_per_tensor form
    (torch.float16, torch.float16, False),
])
def test_quantize_takes_the_documented_dtype_pairs(x_dtype, zero_points, div_mode):
    x = torch.tensor([[-3.0, 0.25, 1.0, 7.5]], dtype=x_dtype)
    scales = torch.full((4,), 0.5 if div_mode else 2.0, dtype=x_dtype)
    zp = torch.tensor([1, 0, -1, 2], dtype=zero_points)
    y = npu_quantize(x, scales, zp, torch.qint8, -1, div_mode)
    assert y.tolist() == [[-5, 0, 1, 17]]  # x * 2 + zp, half to even (0.5 -> 0)


def test_dynamic_quant_is_symmetric_per_token_and_keeps_zero_rows():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 8, generator=g)
    x[1, 2] = 0.0
    y, scale = npu_dynamic_quant(x)
    assert y.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (4, 3)
    for i in range(4):
        for t in range(3):
            amax = max(abs(float(v)) for v in x[i, t])
            assert abs(float(scale[i, t]) - amax / 127) < 1e-7
            for j in range(8):
                want = 0 if amax == 0 else _sat(_round_half_even(float(x[i, t, j]) / (amax / 127)))
                assert abs(int(y[i, t, j]) - want) <= (0 if amax == 0 else 1)
    assert (y[1, 2] == 0).all() and float(scale[1, 2]) == 0.0
    assert int(y.abs().max()) == 127  # each row's largest element maps to +-127


def _int_reference(x1, x2):
    m, k = x1.shape
    n = x2.shape[1]
    return [[sum(int(x1[i, p]) * int(x2[p, j]) for p in range(k)) for j in range(n)]
            for i in range(m)]


def _int8(g, *shape):
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


def test_quant_matmul_static_int32_bias_and_int64_scale():
    g = torch.Generator().manual_seed(2)
    x1, x2 = _int8(g, 3, 16), _int8(g, 16, 5)
    x1[0] = 127  # saturated rows accumulate exactly in int32
    deq = torch.rand(5, generator=g) * 1e-3
    bias = torch.randint(-1000, 1000, (5,), generator=g, dtype=torch.int32)
    bits = deq.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # ModelSlim's int64 deq_scale
    acc = _int_reference(x1, x2)
    for scale, out_dtype in ((bits, torch.float16), (deq, torch.bfloat16), (deq, torch.float32)):
        y = npu_quant_matmul(x1, x2, scale, bias=bias, output_dtype=out_dtype)
        assert y.dtype == out_dtype
        want = torch.tensor([[(acc[i][j] + int(bias[j])) * float(deq[j]) for j in range(5)]
                             for i in range(3)])
        torch.testing.assert_close(y.float(), want.to(out_dtype).float(), rtol=1e-2 if
                                   out_dtype != torch.float32 else 1e-6, atol=1e-3)


def test_quant_matmul_per_token_with_float_bias():
    g = torch.Generator().manual_seed(3)
    x1, x2 = _int8(g, 4, 8), _int8(g, 8, 3)
    w_scale = torch.rand(3, generator=g) * 0.01
    tok = torch.rand(4, generator=g) * 0.1
    tok[2] = 0.0  # a zero row's scale
    bias = torch.randn(3, generator=g)
    y = npu_quant_matmul(x1, x2, w_scale, pertoken_scale=tok, bias=bias,
                         output_dtype=torch.float32)
    acc = _int_reference(x1, x2)
    want = torch.tensor([[acc[i][j] * float(w_scale[j]) * float(tok[i]) + float(bias[j])
                          for j in range(3)] for i in range(4)])
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_quant_matmul_int8_output_saturates_with_offset():
    x1 = torch.full((1, 4), 127, dtype=torch.int8)
    x2 = torch.full((4, 2), 127, dtype=torch.int8)
    y = npu_quant_matmul(x1, x2, torch.tensor([1.0, 1e-5]), offset=torch.tensor([0.0]),
                         output_dtype=torch.int8)
    assert y.tolist() == [[127, 1]]  # 64516 saturates; 0.645 + 0 rounds to 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(scale_dtype=torch.int64, output_dtype=torch.bfloat16), "int64 scale"),
    (dict(scale_dtype=torch.int64, output_dtype=torch.float16, pertoken=True), "int64 scale"),
    (dict(output_dtype=torch.bfloat16, offset=True), "offset is taken with int8 output"),
    (dict(output_dtype=torch.float16, bias_dtype=torch.float32), "float16 output without"),
    (dict(output_dtype=torch.int8, pertoken=True), "int8 output takes"),
    (dict(scale_dtype=torch.bfloat16, output_dtype=torch.float16), "bfloat16 scale"),
])
def test_quant_matmul_refuses_what_the_device_refuses(kwargs, match):
    x1, x2 = torch.ones(2, 4, dtype=torch.int8), torch.ones(4, 3, dtype=torch.int8)
    scale = torch.ones(3, dtype=kwargs.get("scale_dtype", torch.float32))
    with pytest.raises(NPUOpError, match=match):
        npu_quant_matmul(x1, x2, scale,
                         offset=torch.zeros(1) if kwargs.get("offset") else None,
                         pertoken_scale=torch.ones(2) if kwargs.get("pertoken") else None,
                         bias=torch.zeros(3, dtype=kwargs["bias_dtype"])
                         if "bias_dtype" in kwargs else None,
                         output_dtype=kwargs["output_dtype"])


def test_quant_matmul_refuses_float_inputs_and_bad_shapes():
    with pytest.raises(NPUOpError, match="x1 must be int8"):
        npu_quant_matmul(torch.ones(2, 4), torch.ones(4, 3, dtype=torch.int8), torch.ones(3),
                         output_dtype=torch.bfloat16)
    with pytest.raises(NPUOpError, match=r"scale must be \[1\] or \[n=3\]"):
        npu_quant_matmul(torch.ones(2, 4, dtype=torch.int8), torch.ones(4, 3, dtype=torch.int8),
                         torch.ones(2), output_dtype=torch.bfloat16)
    with pytest.raises(NPUOpError, match="scales of 3 elements"):
        npu_quantize(torch.ones(2, 4), torch.ones(3), None, torch.qint8, -1)


# ------------------------------------------------- grouped matmul, per-token int8 form

def _gmm_int8(x, w, scale, pts, group_list, group_list_type=1, out=torch.float32):
    from vllm_npu.ops.sim import npu_grouped_matmul

    return npu_grouped_matmul([x], [w], scale=[scale], per_token_scale=[pts],
                              group_list=group_list, split_item=2, group_type=0,
                              group_list_type=group_list_type, output_dtype=out)[0]


@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_matmul_per_token_int8_matches_integer_math(group_list_type):
    """y[r] = (sum_k x[r, k] * w[g, k, n]) * scale[g, n] * pts[r] for row r of group g,
    with an empty group, saturated inputs (+-127 / -128) and a zero row; rows past the
    groups stay undefined (NaN)."""
    g = torch.Generator().manual_seed(7)
    groups, k, n, rows = 4, 24, 10, 13
    x = torch.randint(-128, 128, (rows, k), generator=g, dtype=torch.int8)
    x[0] = 127
    x[1] = -128
    x[2] = 0
    w = torch.randint(-128, 128, (groups, k, n), generator=g, dtype=torch.int8)
    scale = torch.rand(groups, n, generator=g) * 1e-2
    pts = torch.rand(rows, generator=g) + 0.5
    counts = [3, 0, 5, 4]  # 12 of 13 rows; group 1 empty
    group_list = torch.tensor(counts if group_list_type == 1 else
                              torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int64)
    y = _gmm_int8(x, w, scale, pts, group_list, group_list_type)
    row = 0
    for grp, count in enumerate(counts):
        for r in range(row, row + count):
            for j in range(n):
                acc = sum(int(x[r, i]) * int(w[grp, i, j]) for i in range(k))
                want = torch.tensor(acc, dtype=torch.float32) * scale[grp, j] * pts[r]
                assert float(y[r, j]) == float(want), (r, j)
        row += count
    assert torch.isnan(y[12]).all() and not torch.isnan(y[:12]).any()
    assert (y[2] == 0).all()


def test_grouped_matmul_per_token_bf16_output():
    g = torch.Generator().manual_seed(8)
    x = torch.randint(-128, 128, (4, 16), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (2, 16, 8), generator=g, dtype=torch.int8)
    scale = (torch.rand(2, 8, generator=g) * 1e-2).to(torch.bfloat16)
    pts = torch.rand(4, generator=g)
    y = _gmm_int8(x, w, scale, pts, torch.tensor([2, 2]), out=torch.bfloat16)
    want = torch.cat([(x[:2].double() @ w[0].double()).float() * scale[0].float() * pts[:2, None],
                      (x[2:].double() @ w[1].double()).float() * scale[1].float() * pts[2:, None]])
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, want.to(torch.bfloat16), atol=0, rtol=0)


@pytest.mark.parametrize("change,match", [
    (dict(scale=torch.ones(2, 8, dtype=torch.int64)), "scale is float32 or bfloat16"),
    (dict(scale=torch.ones(2, 8, dtype=torch.bfloat16), out=torch.float16),
     "torch.float16 output takes a torch.float32 scale"),
    # the doc's per-token table has no float32 scale -> bfloat16 y row (the old MoE pair)
    (dict(scale=torch.ones(2, 8), out=torch.bfloat16),
     "torch.bfloat16 output takes a torch.bfloat16 scale"),
    (dict(pts=torch.ones(4, dtype=torch.float16)), "per_token_scale must be float32"),
    (dict(out=torch.int8), "output_dtype torch.int8"),
    (dict(w=torch.ones(2, 16, 8)), "an int8 x needs an int8 weight"),
    (dict(scale=torch.ones(2, 7)), r"scale must be one \[2, 8\] tensor"),
    (dict(pts=torch.ones(3)), r"per_token_scale one \[4\] tensor"),
])
def test_grouped_matmul_per_token_refuses_what_the_device_refuses(change, match):
    args = dict(x=torch.ones(4, 16, dtype=torch.int8), w=torch.ones(2, 16, 8, dtype=torch.int8),
                scale=torch.ones(2, 8), pts=torch.ones(4), out=torch.float32)
    args.update(change)
    with pytest.raises(NPUOpError, match=match):
        _gmm_int8(args["x"], args["w"], args["scale"], args["pts"], torch.tensor([2, 2]),
                  out=args["out"])


def test_grouped_matmul_int8_needs_its_scales_and_float_needs_none():
    from vllm_npu.ops.sim import npu_grouped_matmul

    x8, w8 = torch.ones(4, 16, dtype=torch.int8), torch.ones(2, 16, 8, dtype=torch.int8)
    with pytest.raises(NPUOpError, match="needs scale=.*per_token_scale"):
        npu_grouped_matmul([x8], [w8], group_list=torch.tensor([2, 2]), split_item=2,
                           group_type=0, group_list_type=1, output_dtype=torch.float32)
    with pytest.raises(NPUOpError, match="only the unquantized and the per-token int8"):
        npu_grouped_matmul([torch.ones(4, 16)], [torch.ones(2, 16, 8)],
                           scale=[torch.ones(2, 8)], group_list=torch.tensor([2, 2]),
                           split_item=2, group_type=0, group_list_type=1)
