"""The simulated device's matmul for vLLM's unquantized linear layers.

A device computes a linear layer with its own matmul kernel (the NPU's cube unit); the
simulator's is the host's. For the token counts of a prefill chunk it is oneDNN's
(`mkldnn._linear_pointwise` with the plain weight, the kernel torch's Inductor emits on
CPUs): ~35% faster than MKL's `F.linear` on this project's 2-core host for 8,192 x 128
inputs (docs/performance.md, "Prefill in place"), same float32 inputs and accumulation,
equal to `F.linear` within float32 rounding (bitwise at 128-wide inputs in that
measurement). Decode-sized inputs keep `F.linear` (oneDNN's per-call cost loses there),
as does any other dtype or a torch built without oneDNN.

In a graph replay (decode) a linear runs on the device's cores (torch's OpenMP team,
`native.linear`): `csrc/sim_gemm.c` for the device's K-major weights (layers/linear.py
`device_weight_layout`; multiply-adds on rows of w^T, N in whole vectors of 16) and for
[N, K] weights whose inner dim is whole vectors of 16 (the same on panels of w^T packed
per call from 32 rows, tiles of 4 x 4 dot products below; AVX-512 on hosts that have it;
the output columns split between the cores), else MKL's
`sgemm_` on rows split between them. Within float32 rounding of `F.linear` (another
summation order). 128-row products, 2 cores, warm: K-major 27-85 us, dot products 34-115
us, F.linear 27-96 us (docs/performance.md, 2026-12-05, 8226402).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from vllm_npu.ops.sim import cores, native

# rows (tokens) from which oneDNN wins; decode batches (<= 512 rows) stay on F.linear
ONEDNN_MIN_ROWS = 1024


@functools.cache
def _onednn() -> bool:
    return torch.backends.mkldnn.is_available() and \
        hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T + bias, as `F.linear`."""
    if x.dtype == weight.dtype == torch.float32 and weight.dim() == 2 and x.dim() >= 2 \
            and x.numel() >= ONEDNN_MIN_ROWS * x.shape[-1] and _onednn() \
            and (bias is None or bias.dtype == torch.float32):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def replay_linear_into(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       *, out: torch.Tensor) -> torch.Tensor:
    """A replayed aten `linear` written into its captured output `out`: rows split over
    the device's cores (`native.linear`), else aten's `linear.out` on them."""
    threads = cores.device_cores()
    if threads > 1 and native.linear(x, weight, bias, out, threads):
        return out
    with cores.device_compute_threads():
        return torch.ops.aten.linear.out(x, weight, bias, out=out)


def replay_linear_launch(x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, *,
                         out: torch.Tensor) -> native.Launch | None:
    """`replay_linear_into` prepared at capture (graph.py): the rows split over the
    device's cores, or None (the replay then runs `replay_linear_into`)."""
    threads = cores.device_cores()
    return native.linear_launch(x, weight, bias, out, threads) if threads > 1 else None


def device_linear(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` on the device's cores from wherever it is called (vLLM's logits projection
    runs outside the model's forward, on the host's one torch thread): rows split over
    them (`native.linear`), else `linear` with torch's threads set to them."""
    threads = cores.device_cores()
    if threads > 1 and x.dim() == 2:
        out = x.new_empty(x.shape[0], weight.shape[0])
        if native.linear(x, weight, bias, out, threads):
            return out
    with cores.device_compute_threads():
        return linear(x, weight, bias)
