"""vLLM's draft-proposer Triton kernels (EAGLE, EAGLE-3, MTP, draft_model) as batched torch.

Registered through `Platform.register_triton_kernel_overrides` under the kernels' own
names (vllm/v1/spec_decode/utils.py); each function takes the kernel's parameters by the
kernel's names and writes the same outputs, for every request at once.
"""
from __future__ import annotations

import torch


def _exclusive_starts(counts: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(counts, 0) - counts


def eagle_prepare_inputs_padded_kernel(cu_num_draft_tokens_ptr,
                                       valid_sampled_tokens_count_ptr,
                                       query_start_loc_gpu_ptr, token_indices_to_sample_ptr,
                                       num_rejected_tokens_gpu_ptr, num_reqs):
    """Per request: rejected = drafts + 1 - valid (0 without drafts); the token to
    sample from is the last query token minus the rejected ones."""
    n = int(num_reqs)
    if n == 0:
        return
    cu = cu_num_draft_tokens_ptr[:n].long()
    drafts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    rejected = drafts + 1 - valid_sampled_tokens_count_ptr[:n].long()
    rejected = torch.where(drafts > 0, rejected, torch.zeros_like(rejected))
    last = query_start_loc_gpu_ptr[1:n + 1].long() - 1
    token_indices_to_sample_ptr[:n] = (last - rejected).to(token_indices_to_sample_ptr.dtype)
    num_rejected_tokens_gpu_ptr[:n] = rejected.to(num_rejected_tokens_gpu_ptr.dtype)


def eagle_prepare_next_token_padded_kernel(sampled_token_ids_ptr, discard_request_mask_ptr,
                                           backup_next_token_ids_ptr, next_token_ids_ptr,
                                           valid_sampled_tokens_count_ptr, vocab_size,
                                           num_sampled_tokens_per_req, num_reqs,
                                           stride_sampled_token_ids, BLOCK_SIZE_TOKENS=None):
    """Per request: the number of valid sampled tokens (not -1, inside the vocabulary)
    and the last valid one, or the backup token when none is valid or it is discarded."""
    n, width = int(num_reqs), int(num_sampled_tokens_per_req)
    if n == 0:
        return
    ids = sampled_token_ids_ptr[:n, :width].long()
    valid = (ids != -1) & (ids < vocab_size)
    count = valid.sum(dim=1)
    cols = torch.arange(width, device=ids.device).expand(n, width)
    last = torch.where(valid, cols, torch.full_like(cols, -1)).max(dim=1).values
    last_token = ids.gather(1, last.clamp(min=0)[:, None])[:, 0]
    backup = backup_next_token_ids_ptr[:n].long()
    discard = discard_request_mask_ptr[:n].bool()
    use_backup = discard | (count == 0)
    next_token_ids_ptr[:n] = torch.where(use_backup, backup, last_token).to(
        next_token_ids_ptr.dtype)
    valid_sampled_tokens_count_ptr[:n] = torch.where(discard, torch.zeros_like(count),
                                                     count).to(
        valid_sampled_tokens_count_ptr.dtype)


def eagle_step_slot_mapping_metadata_kernel(positions_ptr, block_table_ptr,
                                            block_table_stride, seq_lens_ptr,
                                            out_clamped_positions_ptr, out_slot_mapping_ptr,
                                            block_size, max_model_len, n_blocks_per_req,
                                            PAD_ID, batch_size):
    """One draft step: position + 1 (0 past max_model_len), its slot from the block
    table, seq_len + 1 (1 past the end); rows beyond the batch (graph padding) get PAD."""
    n = int(batch_size)
    out_slot_mapping_ptr[n:] = PAD_ID
    if n == 0:
        return
    new = positions_ptr[:n].long() + 1
    exceeds = new >= max_model_len
    clamped = torch.where(exceeds, torch.zeros_like(new), new)
    block_index = (clamped // block_size).clamp(max=n_blocks_per_req - 1)
    rows = torch.arange(n, device=new.device)
    block_ids = block_table_ptr[rows, block_index].long()
    slots = torch.where(exceeds, torch.full_like(new, PAD_ID),
                        block_ids * block_size + clamped % block_size)
    seq = seq_lens_ptr[:n].long()
    new_seq = torch.where(exceeds, torch.ones_like(seq), seq + 1).clamp(max=max_model_len)
    out_clamped_positions_ptr[:n] = clamped.to(out_clamped_positions_ptr.dtype)
    out_slot_mapping_ptr[:n] = slots.to(out_slot_mapping_ptr.dtype)
    seq_lens_ptr[:n] = new_seq.to(seq_lens_ptr.dtype)


def copy_and_expand_eagle_inputs_kernel(
        target_token_ids_ptr, target_positions_ptr, next_token_ids_ptr, out_input_ids_ptr,
        out_positions_ptr, out_is_rejected_token_mask_ptr, out_is_masked_token_mask_ptr,
        out_new_token_indices_ptr, out_hidden_state_mapping_ptr, query_start_loc_ptr,
        query_end_loc_ptr, padding_token_id, parallel_drafting_token_id,
        total_input_tokens, num_padding_slots_per_request, shift_input_ids,
        BLOCK_SIZE_TOKENS=None):
    """The draft's inputs from the target's: per request its valid tokens (shifted by one
    when the draft takes hidden states), the bonus token, parallel-drafting slots, then
    the rejected tokens' slots (padding, position 0)."""
    batch = query_end_loc_ptr.shape[0]
    if batch == 0:
        return
    pad_slots = int(num_padding_slots_per_request)
    device = query_start_loc_ptr.device
    starts = query_start_loc_ptr[:batch].long()
    next_starts = query_start_loc_ptr[1:batch + 1].long()
    ends = query_end_loc_ptr[:batch].long()
    r = torch.arange(batch, device=device)
    if shift_input_ids:
        n_valid, offset, out_start = ends - starts, 1, starts + r * (pad_slots - 1)
    else:
        n_valid, offset, out_start = ends - starts + 1, 0, starts + r * pad_slots
    n_rejected = next_starts - ends - 1
    total = n_valid + pad_slots + n_rejected
    req = torch.repeat_interleave(r, total)
    j = torch.arange(req.numel(), device=device) - torch.repeat_interleave(
        _exclusive_starts(total), total)
    nv = n_valid[req]
    valid_region = j < nv
    bonus_region = j == nv
    parallel_region = (j > nv) & (j < nv + pad_slots)
    rejected_region = j >= nv + pad_slots
    out_idx = out_start[req] + j
    in_idx = (starts[req] + offset + j).clamp(max=int(total_input_tokens) - 1)
    tokens = torch.where(valid_region, target_token_ids_ptr[in_idx].long(), 0)
    tokens = torch.where(bonus_region, next_token_ids_ptr[req].long(), tokens)
    tokens = torch.where(parallel_region, int(parallel_drafting_token_id), tokens)
    tokens = torch.where(rejected_region, int(padding_token_id), tokens)
    first_pos = target_positions_ptr[starts].long()[req]
    positions = torch.where(rejected_region, 0, first_pos + j)
    out_input_ids_ptr[out_idx] = tokens.to(out_input_ids_ptr.dtype)
    out_positions_ptr[out_idx] = positions.to(out_positions_ptr.dtype)
    out_is_rejected_token_mask_ptr[out_idx] = rejected_region
    out_is_masked_token_mask_ptr[out_idx] = parallel_region
    new_region = (j >= nv) & (j < nv + pad_slots)
    new_idx = req * pad_slots + (j - nv)
    out_new_token_indices_ptr[new_idx[new_region]] = out_idx[new_region].to(
        out_new_token_indices_ptr.dtype)
    if shift_input_ids:
        is_input = j < (next_starts - starts)[req]
        src = starts[req] + j
        out_hidden_state_mapping_ptr[src[is_input]] = out_idx[is_input].to(
            out_hidden_state_mapping_ptr.dtype)


_MODULE = "vllm.v1.spec_decode.utils"
KERNELS = {f"{_MODULE}.{fn.__name__}": fn for fn in (
    eagle_prepare_inputs_padded_kernel, eagle_prepare_next_token_padded_kernel,
    eagle_step_slot_mapping_metadata_kernel, copy_and_expand_eagle_inputs_kernel)}
