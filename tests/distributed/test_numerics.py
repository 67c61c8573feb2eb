"""Rounding of the simulator's fp16/bf16 reductions, edge cases included, against the
arithmetic gloo uses for 2 ranks: (a.float() op b.float()) rounded to nearest even."""
from __future__ import annotations

import threading

import pytest
import torch

from vllm_npu.distributed.hccl_library import (
    HcclDataTypeEnum,
    HcclLibrary,
    HcclReduceOpEnum,
)


@pytest.fixture(scope="module")
def lib(sim_library) -> HcclLibrary:
    return HcclLibrary(sim_library)


def _all_reduce_threads(lib, inputs: list[torch.Tensor], op: int) -> list[torch.Tensor]:
    """All-reduce across len(inputs) ranks that are threads of this process."""
    n = len(inputs)
    root = lib.HcclGetRootInfo()
    outs = [torch.empty_like(x) for x in inputs]
    errors: list = []

    def rank_main(r: int) -> None:
        try:
            comm = lib.HcclCommInitRootInfo(n, root, r)
            try:
                lib.HcclAllReduce(inputs[r].data_ptr(), outs[r].data_ptr(), inputs[r].numel(),
                                  HcclDataTypeEnum.from_torch(inputs[r].dtype), op, comm,
                                  None, r)
            finally:
                lib.HcclCommDestroy(comm, r)
        except Exception as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return outs


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal, any NaN matching any NaN."""
    nan = a.isnan()
    return bool(torch.equal(nan, b.isnan())
                and torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_bit_pattern_round_trips(lib, dtype):
    """1 rank: load to float and store back is the identity on all 65536 values."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    (out,) = _all_reduce_threads(lib, [x], HcclReduceOpEnum.SUM)
    assert _same_bits(out, x)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_two_rank_rounding_matches_torch(lib, dtype, op):
    """Random bit patterns (all exponents: subnormals, overflow to inf, NaN) on 2 ranks."""
    g = torch.Generator().manual_seed(7)
    a, b = (torch.randint(-32768, 32768, (200_000,), generator=g, dtype=torch.int32)
            .to(torch.int16).view(dtype) for _ in range(2))
    code = getattr(HcclReduceOpEnum, {"prod": "PROD"}.get(op, op.upper()))
    if (dtype, op) == (torch.bfloat16, "prod"):  # refused on an Atlas A2, as by the sim
        with pytest.raises(AssertionError, match="prod does not support data type 11"):
            _all_reduce_threads(lib, [a, b], code)
        return
    out0, out1 = _all_reduce_threads(lib, [a, b], code)
    fa, fb = a.float(), b.float()
    want = {"sum": fa + fb, "prod": fa * fb,
            # the simulator keeps the first operand unless the second is strictly greater
            # (smaller), as std::max / std::min do; NaN handling is then order-defined
            "max": torch.where(fa < fb, fb, fa), "min": torch.where(fb < fa, fb, fa)}[op]
    want = want.to(dtype)
    assert _same_bits(out0, out1)
    assert _same_bits(out0, want)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float64])
def test_reductions_refuse_what_an_atlas_a2_cannot_reduce(lib, dtype):
    """HcclAllReduce on an Atlas A2: int8/16/32/64, float16/32, bfp16 only."""
    x = torch.ones(8, dtype=dtype)
    with pytest.raises(AssertionError, match=r"not supported for reductions \(Atlas A2: "
                                             r"int8, int16, int32, int64, float16, float32, "
                                             r"bfp16\)"):
        _all_reduce_threads(lib, [x, x.clone()], HcclReduceOpEnum.SUM)
