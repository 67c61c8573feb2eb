"""The simulated DeepSeek-V3.2 sparse attention ops against dense computations written
here: the indexer's top-k against the full score matrix under a causal mask (as HF's
DeepseekV32 indexer scores and masks), sparse attention against dense attention with every
key outside the selected set masked out. Requests mix a prefill with cached context, a
fresh prompt and a single-token decode; keys sit in shuffled blocks of a paged cache."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.ops.sim import sparse_attention as sa
from vllm_npu.ops.sim.checks import NPUOpError

BS = 16
HEADS = 8
# (new query tokens, key length) per request: cached context + prefill, a whole prompt,
# a decode step
REQUESTS = [(20, 45), (33, 33), (1, 70)]


def _paged(rows: list[torch.Tensor], width: int, seed: int):
    """Scatter each request's rows [S2, width] into shuffled blocks -> (cache, table)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-len(r) // BS) for r in rows]
    order = torch.randperm(sum(need) + 3, generator=gen)
    cache = torch.randn(len(order), BS, 1, width, generator=gen)  # junk outside the rows
    table = torch.zeros(len(rows), max(need), dtype=torch.int32)
    used = 0
    for i, r in enumerate(rows):
        blocks = order[used:used + need[i]]
        used += need[i]
        table[i, :need[i]] = blocks.to(torch.int32)
        flat = cache[blocks].reshape(-1, width)
        flat[:len(r)] = r
        cache[blocks] = flat.view(-1, BS, 1, width)
    return cache, table


def _lens():
    ends = torch.tensor(REQUESTS)[:, 0].cumsum(0).to(torch.int32)
    return ends, torch.tensor(REQUESTS, dtype=torch.int32)[:, 1]


def _causal(s1: int, s2: int) -> torch.Tensor:
    """[s1, s2] True where query row r (the last s1 positions) may see key j."""
    return torch.arange(s2).unsqueeze(0) <= torch.arange(s2 - s1, s2).unsqueeze(1)


def _indexer_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(q for q, _ in REQUESTS)
    query = torch.randn(tokens, HEADS, sa.LI_HEAD_DIM, generator=gen)
    weights = torch.randn(tokens, HEADS, generator=gen)
    keys = [torch.randn(s2, sa.LI_HEAD_DIM, generator=gen) for _, s2 in REQUESTS]
    return query, weights, keys


@pytest.mark.parametrize("count", [8, 40, 2048])
def test_indexer_picks_the_top_scored_visible_keys(count):
    query, weights, keys = _indexer_inputs()
    cache, table = _paged(keys, sa.LI_HEAD_DIM, 1)
    ends, klens = _lens()
    got, values = sa.npu_lightning_indexer(
        query, cache, weights, actual_seq_lengths_query=ends, actual_seq_lengths_key=klens,
        block_table=table, sparse_count=count)
    assert got.shape == (query.shape[0], 1, count) and got.dtype == torch.int32
    assert values.numel() == 0
    t = 0
    for (s1, s2), k in zip(REQUESTS, keys):
        scores = torch.stack([(weights[t:t + s1, h, None] *
                               torch.relu(query[t:t + s1, h] @ k.T)) for h in range(HEADS)]
                             ).sum(0)
        visible = _causal(s1, s2)
        for r in range(s1):
            n = min(count, int(visible[r].sum()))
            want = set(torch.topk(scores[r].masked_fill(~visible[r], float("-inf")),
                                  n).indices.tolist())
            row = got[t + r, 0].tolist()
            assert set(row[:n]) == want
            assert row[n:] == [-1] * (count - n)
        t += s1


def test_indexer_without_mask_sees_every_key():
    query, weights, keys = _indexer_inputs(3)
    cache, table = _paged(keys, sa.LI_HEAD_DIM, 4)
    ends, klens = _lens()
    got, _ = sa.npu_lightning_indexer(
        query, cache, weights, actual_seq_lengths_query=ends, actual_seq_lengths_key=klens,
        block_table=table, sparse_count=2048, sparse_mode=0)
    t = 0
    for s1, s2 in REQUESTS:
        for r in range(s1):
            assert sorted(got[t + r, 0, :s2].tolist()) == list(range(s2))
        t += s1


def _sfa_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(q for q, _ in REQUESTS)
    q = torch.randn(tokens, HEADS, sa.SFA_LATENT, generator=gen) * 0.05
    qr = torch.randn(tokens, HEADS, sa.SFA_ROPE, generator=gen) * 0.05
    latents = [torch.randn(s2, sa.SFA_LATENT, generator=gen) for _, s2 in REQUESTS]
    ropes = [torch.randn(s2, sa.SFA_ROPE, generator=gen) for _, s2 in REQUESTS]
    return q, qr, latents, ropes


def _random_indices(count: int, seed: int) -> torch.Tensor:
    """Per token: up to `count` distinct positions it may see, in random order (as the
    indexer gives them: valid entries first), then -1 padding."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for s1, s2 in REQUESTS:
        for r in range(s1):
            pick = torch.randperm(s2 - s1 + r + 1, generator=gen)[:count].tolist()
            rows.append(pick + [-1] * (count + 4 - len(pick)))
    return torch.tensor(rows, dtype=torch.int32).unsqueeze(1)


def test_sparse_attention_matches_dense_attention_over_the_selected_keys():
    q, qr, latents, ropes = _sfa_inputs()
    kv, table = _paged(latents, sa.SFA_LATENT, 2)
    kr, _ = _paged(ropes, sa.SFA_ROPE, 2)  # same seed: the same block table
    ends, klens = _lens()
    indices = _random_indices(24, 5)
    scale = 0.07
    got, _, _ = sa.npu_sparse_flash_attention(
        q, kv, kv, indices, scale, block_table=table, actual_seq_lengths_query=ends,
        actual_seq_lengths_kv=klens, query_rope=qr, key_rope=kr)
    t = 0
    for (s1, s2), lat, rope in zip(REQUESTS, latents, ropes):
        for r in range(s1):
            chosen = torch.zeros(s2, dtype=torch.bool)
            picks = [i for i in indices[t + r, 0].tolist() if i >= 0]
            chosen[picks] = True
            scores = (q[t + r] @ lat.T + qr[t + r] @ rope.T) * scale     # [H, S2]
            want = torch.softmax(scores.masked_fill(~chosen, float("-inf")), -1) @ lat
            torch.testing.assert_close(got[t + r], want, rtol=1e-5, atol=1e-5)
        t += s1


def test_sparse_attention_skips_future_keys_and_gives_zeros_without_keys():
    q, qr, latents, ropes = _sfa_inputs(3)
    kv, table = _paged(latents, sa.SFA_LATENT, 4)
    kr, _ = _paged(ropes, sa.SFA_ROPE, 4)
    ends, klens = _lens()
    indices = torch.full((sum(s1 for s1, _ in REQUESTS), 1, 4), -1, dtype=torch.int32)
    indices[0, 0, :2] = torch.tensor([30, 2])  # row 0 of request 0 sees keys 0..25
    # indices[1] stays all -1: no key
    got, _, _ = sa.npu_sparse_flash_attention(
        q, kv, kv, indices, 0.1, block_table=table, actual_seq_lengths_query=ends,
        actual_seq_lengths_kv=klens, query_rope=qr, key_rope=kr)
    torch.testing.assert_close(got[0], latents[0][2].expand(HEADS, -1))  # softmax of one
    assert not got[1].any()


def test_indexer_then_sparse_attention_with_every_key_is_causal_attention():
    """sparse_count >= every key length: the pair computes plain causal MLA attention."""
    q, qr, latents, ropes = _sfa_inputs(7)
    kv, table = _paged(latents, sa.SFA_LATENT, 8)
    kr, _ = _paged(ropes, sa.SFA_ROPE, 8)
    iq, w, ik = _indexer_inputs(9)
    icache, itable = _paged(ik, sa.LI_HEAD_DIM, 8)
    assert torch.equal(itable, table)
    ends, klens = _lens()
    picked, _ = sa.npu_lightning_indexer(iq, icache, w, actual_seq_lengths_query=ends,
                                         actual_seq_lengths_key=klens, block_table=table,
                                         sparse_count=128)
    got, _, _ = sa.npu_sparse_flash_attention(
        q, kv, kv, picked, 0.1, block_table=table, actual_seq_lengths_query=ends,
        actual_seq_lengths_kv=klens, query_rope=qr, key_rope=kr)
    t = 0
    for (s1, s2), lat, rope in zip(REQUESTS, latents, ropes):
        scores = (torch.einsum("shd,jd->shj", q[t:t + s1], lat)
                  + torch.einsum("shd,jd->shj", qr[t:t + s1], rope)) * 0.1
        mask = _causal(s1, s2).unsqueeze(1)
        want = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ lat
        torch.testing.assert_close(got[t:t + s1], want, rtol=1e-5, atol=1e-5)
        t += s1


def _li_call(**change):
    query, weights, keys = _indexer_inputs()
    cache, table = _paged(keys, sa.LI_HEAD_DIM, 1)
    ends, klens = _lens()
    args = dict(query=query, key=cache, weights=weights, actual_seq_lengths_query=ends,
                actual_seq_lengths_key=klens, block_table=table)
    args.update(change)
    return sa.npu_lightning_indexer(**args)


@pytest.mark.parametrize("change,message", [
    (dict(query=torch.randn(124, 8, 64)), "D 128"),
    (dict(query=torch.randn(124, 72, 128), weights=torch.randn(124, 72)), "1..64 heads"),
    (dict(key=torch.randn(20, 16, 2, 128)), "one key head"),
    (dict(key=torch.randn(20, 24, 1, 128)), "multiple of 16"),
    (dict(sparse_count=2500), "sparse_count 2500"),
    (dict(sparse_mode=1), "sparse_mode 1"),
    (dict(actual_seq_lengths_key=torch.tensor([45, 33, 70])), "int32"),
    (dict(layout_key="PA_BNSD"), "valid: query BSND or TND"),
])
def test_indexer_refuses_what_the_kernel_refuses(change, message):
    with pytest.raises(NPUOpError, match=message):
        _li_call(**change)


def test_indexer_refuses_a_block_table_shorter_than_a_key_length():
    query, weights, keys = _indexer_inputs()
    cache, table = _paged(keys, sa.LI_HEAD_DIM, 1)
    with pytest.raises(NPUOpError, match="a key length of 70 needs 5 of 16"):
        _li_call(key=cache, block_table=table[:, :4])


def test_indexer_refuses_more_query_tokens_than_keys():
    ends = torch.tensor([20, 53, 54], dtype=torch.int32)
    with pytest.raises(NPUOpError, match="20 query tokens but key length 10"):
        _li_call(actual_seq_lengths_query=ends,
                 actual_seq_lengths_key=torch.tensor([10, 33, 70], dtype=torch.int32))


def _sfa_call(**change):
    q, qr, latents, ropes = _sfa_inputs()
    kv, table = _paged(latents, sa.SFA_LATENT, 2)
    kr, _ = _paged(ropes, sa.SFA_ROPE, 2)
    ends, klens = _lens()
    args = dict(query=q, key=kv, value=kv, sparse_indices=_random_indices(4, 1),
                scale_value=0.1, block_table=table, actual_seq_lengths_query=ends,
                actual_seq_lengths_kv=klens, query_rope=qr, key_rope=kr)
    args.update(change)
    return sa.npu_sparse_flash_attention(**args)


@pytest.mark.parametrize("change,message", [
    (dict(query=torch.randn(54, 8, 256)), "D 512"),
    (dict(query=torch.randn(54, 6, 512), query_rope=torch.randn(54, 6, 64)),
     "6 query heads per kv head"),
    (dict(attention_mode=1), "only 2"),
    (dict(sparse_block_size=3), "power of two"),
    (dict(sparse_indices=torch.zeros(54, 1, 4, dtype=torch.int64)), "int32"),
    (dict(query_rope=None), "rope cannot be empty"),
    (dict(key=torch.randn(20, 16, 1, 512, dtype=torch.float16)), "dtype"),
])
def test_sparse_attention_refuses_what_the_kernel_refuses(change, message):
    with pytest.raises(NPUOpError, match=message):
        _sfa_call(**change)


def test_single_cache_write_scatters_rows_and_skips_padding():
    from vllm_npu.ops.sim.cache import _npu_reshape_and_cache_siso

    cache = torch.zeros(4, BS, 1, 8)
    key = torch.randn(5, 1, 8)
    slots = torch.tensor([17, -1, 0, 63, 5], dtype=torch.int32)
    _npu_reshape_and_cache_siso(key, cache, slots)
    flat = cache.view(-1, 8)
    for row, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(flat[slot], key[row, 0])
    assert int((flat.abs().sum(-1) > 0).sum()) == 4
    with pytest.raises(NPUOpError, match="must be < 64"):
        _npu_reshape_and_cache_siso(key, cache, torch.tensor([64, 0, 1, 2, 3],
                                                             dtype=torch.int32))
