"""Sequence lengths on the host, as the NPU kernels take them.

FIA's `actual_seq_lengths_kv` and paged attention's `context_lens` are host integer
arrays, so every builder needs the batch's sequence lengths on the host. vLLM hands over
`seq_lens_cpu_upper_bound`, which is exact for a plain batch but not under speculative
decoding: with async spec decode it is only an upper bound (how many drafts were accepted
is known on the device), and in a draft model's first pass vLLM's
`extend_all_queries_by_N` (v1/spec_decode/utils.py) moves `seq_lens` by N without moving
the bound. There the device tensor is read (on a device: one stream synchronisation per
build), so the kernels never see a length one short — the classic "acceptance stuck at 0"
fault of draft positions.
"""
from __future__ import annotations

import torch
from vllm.v1.attention.backend import CommonAttentionMetadata


def host_seq_lens(cm: CommonAttentionMetadata, num_reqs: int, speculative: bool) -> torch.Tensor:
    bound = cm.seq_lens_cpu_upper_bound
    lens = cm.seq_lens.cpu() if bound is None or speculative else bound
    return lens[:num_reqs].to(torch.int32)
