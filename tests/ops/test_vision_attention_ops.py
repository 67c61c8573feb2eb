"""`_npu_flash_attention_unpad` (vision encoders' attention) on the simulated NPU: equal to
per-sequence softmax attention written out in plain PyTorch, and refusing what the device
op refuses."""
from __future__ import annotations

import math

import pytest
import torch

from vllm_npu.ops.sim.checks import NPUOpError
from vllm_npu.ops.sim.vision_attention import _npu_flash_attention_unpad as unpad


def _reference(q, k, v, lengths, scale):
    """Each sequence, each head, each query row on its own: weights over the sequence's
    keys (its group's K/V head), then the weighted sum of values."""
    heads, kv_heads = q.shape[1], k.shape[1]
    out = torch.zeros_like(q, dtype=torch.float64)
    start = 0
    for n in lengths:
        for h in range(heads):
            kh = h // (heads // kv_heads)
            for i in range(start, start + n):
                logits = [float(q[i, h].double() @ k[j, kh].double()) * scale
                          for j in range(start, start + n)]
                top = max(logits)
                w = [math.exp(x - top) for x in logits]
                total = sum(w)
                for j, wj in zip(range(start, start + n), w):
                    out[i, h] += wj / total * v[j, kh].double()
        start += n
    return out


def _inputs(lengths, heads, kv_heads, dim, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    q = torch.randn(t, heads, dim, generator=g).to(dtype)
    k = torch.randn(t, kv_heads, dim, generator=g).to(dtype)
    v = torch.randn(t, kv_heads, dim, generator=g).to(dtype)
    return q, k, v, torch.tensor(lengths, dtype=torch.int32)


@pytest.mark.parametrize("lengths,heads,kv_heads,dim", [
    ([5], 2, 2, 16),             # one image
    ([4, 4, 9, 1], 4, 4, 8),     # windows of one image, a one-token sequence
    ([3, 7], 4, 2, 16),          # grouped K/V heads
])
def test_matches_per_sequence_attention(lengths, heads, kv_heads, dim):
    q, k, v, seq_len = _inputs(lengths, heads, kv_heads, dim)
    out = torch.empty_like(q)
    scale = dim ** -0.5
    got = unpad(q, k, v, seq_len, scale, heads, kv_heads, out)
    assert got is out
    torch.testing.assert_close(out.double(), _reference(q, k, v, lengths, scale),
                               rtol=1e-5, atol=1e-5)


def test_sequences_do_not_see_each_other():
    q, k, v, seq_len = _inputs([3, 4], 2, 2, 8)
    out_a = unpad(q, k, v, seq_len, 0.3, 2, 2, torch.empty_like(q))
    v2 = v.clone()
    v2[3:] += 10.0  # only the second sequence's values change
    out_b = unpad(q, k, v2, seq_len, 0.3, 2, 2, torch.empty_like(q))
    assert torch.equal(out_a[:3], out_b[:3]) and not torch.allclose(out_a[3:], out_b[3:])


def test_bf16_in_bf16_out():
    q, k, v, seq_len = _inputs([6, 2], 2, 1, 16, dtype=torch.bfloat16)
    out = unpad(q, k, v, seq_len, 0.25, 2, 1, torch.empty_like(q))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), _reference(q, k, v, [6, 2], 0.25),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("change,message", [
    (dict(seq_len=torch.tensor([3, 4], dtype=torch.int64)), "1-D int32 host"),
    (dict(seq_len=torch.tensor([7], dtype=torch.int32).view(1, 1)), "1-D int32 host"),
    (dict(seq_len=torch.tensor([3, 3], dtype=torch.int32)), "summing to the 7 tokens"),
    (dict(seq_len=torch.tensor([7, 0], dtype=torch.int32)), "positive lengths"),
    (dict(out=torch.empty(7, 2, 4)), "must have the query's shape"),
    (dict(num_kv_heads=3), "positive multiple"),
    (dict(num_heads=4, num_kv_heads=2), "do not match num_heads=4"),
    (dict(query=torch.zeros(7, 2, 8, dtype=torch.int32)), "dtype torch.int32"),
    (dict(key=torch.zeros(7, 2, 8, dtype=torch.float16)), "share one dtype"),
    (dict(query=torch.zeros(2, 7, 8).transpose(0, 1)), "must be contiguous"),
])
def test_refuses_what_the_device_refuses(change, message):
    q, k, v, seq_len = _inputs([3, 4], 2, 2, 8)
    args = dict(query=q, key=k, value=v, seq_len=seq_len, scale_value=0.3, num_heads=2,
                num_kv_heads=2, out=torch.empty_like(q))
    args.update(change)
    with pytest.raises(NPUOpError, match=message):
        unpad(**args)
