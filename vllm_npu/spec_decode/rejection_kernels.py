"""vLLM's rejection-sampler Triton kernels as batched torch (no per-request loop).

Registered through `Platform.register_triton_kernel_overrides` under the kernels' own
names; each function takes the kernel's parameters, by the kernel's names
(vllm/v1/sample/rejection_sampler.py). Per request r with n_r draft tokens starting at
s_r (cu_num_draft_tokens is the inclusive cumulative sum):

    greedy  token p = target argmax; accepted while draft == argmax
    random  accepted while draft >= 0 and target_prob/draft_prob >= u (draft_prob = 1
            without draft probs, 0 rejects); a rejected position takes the recovered token
    output  positions up to and including the first rejection are written; if every
            draft is accepted, the bonus token goes at position n_r
"""
from __future__ import annotations

import torch


def _layout(cu_num: torch.Tensor, batch: int, width: int):
    """Count, the [batch, width] token index (clamped) and which entries are real."""
    cu = cu_num[:batch].long()
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    counts = cu - starts
    pos = torch.arange(width, device=cu.device)
    valid = pos[None, :] < counts[:, None]
    index = starts[:, None] + pos[None, :]
    last = max(int(cu[-1]) - 1, 0) if batch else 0
    return counts, index.clamp(max=last), valid


def _gather(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t[index], or zeros when there are no draft tokens at all (index then points at 0)."""
    return t[index] if t.numel() else torch.zeros(index.shape, dtype=t.dtype,
                                                     device=index.device)


def _write(out: torch.Tensor, rows: torch.Tensor, counts: torch.Tensor, valid: torch.Tensor,
           accepted: torch.Tensor, token: torch.Tensor, bonus: torch.Tensor) -> None:
    width = valid.shape[1]
    ok = (accepted & valid).int()
    all_before = torch.cat([ok.new_ones(ok.shape[0], 1), ok.cumprod(dim=1)[:, :-1]], dim=1)
    write = valid & all_before.bool() & rows[:, None]
    region = out[:, :width]
    region[write] = token[write].to(out.dtype)
    all_accepted = rows & (accepted | ~valid).all(dim=1)
    req = all_accepted.nonzero().flatten()
    out[req, counts[req]] = bonus.reshape(-1)[req].to(out.dtype)


def rejection_greedy_sample_kernel(output_token_ids_ptr, cu_num_draft_tokens_ptr,
                                   draft_token_ids_ptr, target_argmax_ptr,
                                   bonus_token_ids_ptr, is_greedy_ptr, max_spec_len,
                                   uniform_probs_ptr, synthetic_conditional_rates_ptr,
                                   SYNTHETIC_MODE=False):
    out = output_token_ids_ptr
    batch = out.shape[0]
    counts, index, valid = _layout(cu_num_draft_tokens_ptr, batch, max_spec_len)
    draft = _gather(draft_token_ids_ptr, index).long()
    target = _gather(target_argmax_ptr, index).long()
    if SYNTHETIC_MODE:
        rate = synthetic_conditional_rates_ptr[:max_spec_len][None, :]
        accepted = (_gather(uniform_probs_ptr, index) < rate) & (draft >= 0)
        token = torch.where(accepted, draft, target)
    else:
        accepted, token = draft == target, target
    rows = torch.ones(batch, dtype=torch.bool, device=out.device) if is_greedy_ptr is None \
        else is_greedy_ptr[:batch].bool()
    _write(out, rows, counts, valid, accepted, token, bonus_token_ids_ptr)


def rejection_random_sample_kernel(output_token_ids_ptr, cu_num_draft_tokens_ptr,
                                   draft_token_ids_ptr, draft_probs_ptr, target_probs_ptr,
                                   bonus_token_ids_ptr, recovered_token_ids_ptr,
                                   uniform_probs_ptr, is_greedy_ptr, max_spec_len,
                                   vocab_size, synthetic_conditional_rates_ptr,
                                   NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False):
    out = output_token_ids_ptr
    batch = out.shape[0]
    counts, index, valid = _layout(cu_num_draft_tokens_ptr, batch, max_spec_len)
    if draft_token_ids_ptr.numel() == 0:  # no drafts: every non-greedy row takes its bonus
        _write(out, ~is_greedy_ptr[:batch].bool(), counts, valid, valid, valid.long(),
               bonus_token_ids_ptr)
        return
    draft = draft_token_ids_ptr[index].long()
    u = uniform_probs_ptr[index]
    if SYNTHETIC_MODE:
        accepted = u < synthetic_conditional_rates_ptr[:max_spec_len][None, :]
    else:
        safe = draft.clamp(min=0)
        target_prob = target_probs_ptr[index, safe].double()
        draft_prob = (torch.ones_like(target_prob) if NO_DRAFT_PROBS
                      else draft_probs_ptr[index, safe].double())
        ratio = target_prob / torch.where(draft_prob > 0, draft_prob, 1.0)
        accepted = (draft_prob > 0) & (ratio >= u)
    accepted &= draft >= 0
    token = torch.where(accepted, draft, recovered_token_ids_ptr[index].long())
    rows = ~is_greedy_ptr[:batch].bool()
    _write(out, rows, counts, valid, accepted, token, bonus_token_ids_ptr)


def expand_kernel(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to,
                  MAX_NUM_TOKENS=None):
    batch = input_ptr.shape[0]
    if batch == 0:
        return
    cu = cu_num_tokens_ptr[:batch].long()
    counts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    values = torch.where(input_ptr == replace_from,
                         torch.as_tensor(replace_to, dtype=input_ptr.dtype), input_ptr)
    total = int(cu[-1])
    output_ptr[:total] = torch.repeat_interleave(values, counts, output_size=total).to(
        output_ptr.dtype)


def sample_recovered_tokens_kernel(output_token_ids_ptr, cu_num_draft_tokens_ptr,
                                   draft_token_ids_ptr, draft_probs_ptr, target_probs_ptr,
                                   inv_q_ptr, vocab_size, BLOCK_SIZE=None,
                                   NO_DRAFT_PROBS=False, USE_FP64_GUMBEL=False):
    num_tokens = output_token_ids_ptr.shape[0]
    batch = cu_num_draft_tokens_ptr.shape[0]
    if num_tokens == 0 or batch == 0:
        return
    cu = cu_num_draft_tokens_ptr.long()
    counts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    total = int(cu[-1])
    req = torch.repeat_interleave(torch.arange(batch, device=cu.device), counts,
                                  output_size=total)
    target = target_probs_ptr[:total, :vocab_size]
    if NO_DRAFT_PROBS:
        prob = target.clone()
        prob.scatter_(1, draft_token_ids_ptr[:total].long()[:, None], 0.0)
    else:
        prob = (target - draft_probs_ptr[:total, :vocab_size]).clamp(min=0.0)
    inv_q = inv_q_ptr[req, :vocab_size]
    score = prob.to(inv_q.dtype) * inv_q
    output_token_ids_ptr[:total] = score.argmax(dim=1).clamp(max=vocab_size - 1).to(
        output_token_ids_ptr.dtype)


_MODULE = "vllm.v1.sample.rejection_sampler"
KERNELS = {f"{_MODULE}.{fn.__name__}": fn for fn in (
    rejection_greedy_sample_kernel, rejection_random_sample_kernel, expand_kernel,
    sample_recovered_tokens_kernel)}
