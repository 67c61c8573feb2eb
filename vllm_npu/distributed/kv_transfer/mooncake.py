"""vLLM's MooncakeConnector on the NPU: the NPU's KV layout under heterogeneous TP.

vLLM 0.33's connector (kv_connector/v1/mooncake) moves whole KV blocks between a prefill
(producer) and a decode (consumer) instance through the Mooncake transfer engine: the
consumer's worker asks the producer's workers for the blocks of a request, they write them
straight into the consumer's registered KV memory. Everything above the block bytes (the
bootstrap registry, transfer ids, abort and timeout handling, failure reporting to the
scheduler, metrics) is device independent and used as is.

What the NPU changes is the inside of a block. The NPU's paged attention kernels
(`_npu_reshape_and_cache`, `_npu_paged_attention`, FIA's paged form) take K and V as separate
planes of `[num_blocks, block_size, num_kv_heads, head_size]`: inside a block the heads of
one token are adjacent (vLLM's LHBNC with the heads folded into the content). vLLM's
connector plans a heterogeneous-TP copy for head-major blocks (its preferred LBHNC): a
producer rank with `heads / tp_ratio` heads writes its whole block into a contiguous slice of
the consumer's block. On the NPU layout that gives the consumer
`[tp_ratio, block_size, heads / tp_ratio, head_size]`, i.e. wrong tokens without any error
(measured: a tiny Llama served P TP=2 -> D TP=1 decoded different tokens). So:

- producer TP > consumer TP: after a request's blocks have all arrived, and before the
  scheduler sees them, this worker reorders each received block back to
  `[block_size, heads, head_size]` (vllm-ascend does the same after its pulls, with its
  `transpose_kv_cache_by_block` kernel).
- producer TP < consumer TP: the producer would have to send token-strided pieces of each
  block, which the connector's plan cannot express; the request's KV load fails with a
  message naming both TP sizes (the scheduler then fails or recomputes the request, per
  `kv_load_failure_policy`).

MLA's latent cache is the same on every TP rank (replicated), so any TP pair works there.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import TYPE_CHECKING

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as upstream
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.logger import init_logger

from vllm_npu.distributed.kv_transfer.config import PROBE_KEYS
from vllm_npu.distributed.kv_transfer.liveness import watch_peer
from vllm_npu.kv_layout import latent_planes

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = init_logger(__name__)
WRITE_ATTEMPTS = 3  # per block write to a decode instance (see _send_blocks)
RETRY_PAUSE_S = 1.5  # before each retry: past the TCP transport's 1 s reconnect cooldown
# Mooncake 0.3.13's TCP transport fails a session that makes no progress for
# MC_TCP_PROGRESS_TIMEOUT_SEC, or whose write is not acknowledged within
# MC_TCP_STATUS_TIMEOUT_SEC (30 s each; tcp_transport_session_impl.h, Mooncake PR #3542), and
# then drops that connection. A stalled write (see _send_blocks) so held its request 30 s per
# attempt; at 5 s the retry on a new connection comes sooner. Both measure inactivity, not
# the whole transfer, so a slow link that makes progress is not cut. An operator's own
# values win.
TCP_STALL_S = {"MC_TCP_PROGRESS_TIMEOUT_SEC": "5", "MC_TCP_STATUS_TIMEOUT_SEC": "5"}


def reorder_split_blocks(plane: torch.Tensor, block_ids: list[int], splits: int) -> None:
    """In place: blocks written as `splits` contiguous producer slices
    `[splits, block_size, C / splits]` become `[block_size, C]`.

    `plane` is one layer's K or V plane, `[num_blocks, block_size, C]` with
    C = this rank's kv heads x head size (attention/backend.py); producer rank r holds the
    r-th run of heads, so the r-th slice of a token's content.
    """
    if not block_ids or splits == 1:
        return
    _, block_size, content = plane.shape
    if content % splits:
        raise ValueError(f"a KV block row of {content} elements does not split into "
                         f"{splits} producer slices")
    ids = torch.tensor(block_ids, dtype=torch.long, device=plane.device)
    blocks = plane.index_select(0, ids)  # a copy: the reorder reads the old bytes
    sliced = blocks.view(len(block_ids), splits, block_size, content // splits)
    plane.index_copy_(0, ids, sliced.transpose(1, 2).reshape(blocks.shape))


class NPUMooncakeConnectorWorker(upstream.MooncakeConnectorWorker):
    """The upstream worker plus the NPU layout rules for heterogeneous TP (module doc)."""

    def __init__(self, vllm_config: VllmConfig, engine_id: str,
                 kv_cache_config: KVCacheConfig):
        for name, value in TCP_STALL_S.items():   # read by the transfer engine made below
            os.environ.setdefault(name, value)
        super().__init__(vllm_config, engine_id, kv_cache_config)
        # Splits heads across TP: the only case where the in-block layout matters.
        self._heads_split = not self.use_mla and not kv_cache_config.has_mamba_layers
        self._pulls: dict[str, tuple[str, list[list[int]]]] = {}
        self._pulls_lock = threading.Lock()  # start_load_kv and the receiver loop
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self._probe_interval_s, self._probe_misses = (
            kind(extra.get(key, default)) for key, kind, default in PROBE_KEYS)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        super().register_kv_caches(kv_caches)
        if self.use_mla:
            self._split_latent_regions()

    def _split_latent_regions(self) -> None:
        """The NPU MLA backend lays a layer's latent memory out as two planes (nope, then
        rope: vllm_npu/kv_layout.py `latent_planes`), so a block's bytes are two runs, not the
        one `[block_size, L + R]` run vLLM's registration assumes. Each layer's region
        becomes two, under the same layer name (the connector matches repeated names by
        occurrence), in every peer alike. Other caches of an MLA model (DeepSeek-V3.2's
        indexer keys, [num_blocks, 1, block_size, 128]) are one run per block: kept."""
        hf = self.model_config.hf_text_config
        rank, width = hf.kv_lora_rank, hf.kv_lora_rank + hf.qk_rope_head_dim
        fields = ("kv_caches_base_addr", "block_len_per_layer", "kv_block_len_per_layer",
                  "registered_layer_names", "registered_layer_indices",
                  "registered_group_indices", "region_shared_groups", "region_row_offsets")
        old = list(zip(*(getattr(self, f) for f in fields)))
        new = []
        for row in old:
            name = row[3]
            cache = self.device_kv_caches[name]
            if cache.shape[-1] != width:  # DeepSeek-V3.2's indexer keys: one plane, as is
                new.append(row)
                continue
            # vLLM hands the connector [num_blocks, 1, block_size, L + R] (its logical
            # [B, H, N, C]); the backend reads it as [num_blocks, block_size, L + R].
            planes = latent_planes(cache.view(cache.shape[0], -1, width), rank)
            for plane in planes:
                run = plane[0].nbytes  # one block's rows in this plane
                new.append((plane.data_ptr(), run, run, *row[3:7], -1))
        for f, column in zip(fields, zip(*new)):
            setattr(self, f, list(column))
        self.opaque_packed_storages = set()

    def _producer_splits(self, remote_engine_id: str) -> int:
        """How many producer ranks share one of this rank's blocks (1: no reorder)."""
        remote_tp = self._tp_size.get(remote_engine_id, self.tp_size)
        heads = self.transfer_topo.total_num_kv_heads
        if not self._heads_split or remote_tp <= self.tp_size:
            return 1
        # Ranks beyond the head count replicate heads and send no extra slices.
        return max(1, min(remote_tp, heads) // min(self.tp_size, heads))

    def start_load_kv(self, metadata: upstream.MooncakeConnectorMetadata) -> None:
        if self._heads_split and not self.is_kv_producer:
            with self._pulls_lock:
                for engine_id, pulls in metadata.reqs_to_recv.items():
                    for req_id, meta in pulls.items():
                        if any(meta.local_block_ids):
                            self._pulls[req_id] = (engine_id, meta.local_block_ids)
        super().start_load_kv(metadata)

    def receive_kv(self, remote_engine_id: str, pull_metas: dict) -> None:
        remote_tp = self._tp_size[remote_engine_id]
        heads = self.transfer_topo.total_num_kv_heads
        if self._heads_split and min(remote_tp, heads) < min(self.tp_size, heads):
            # Release the prefill side's blocks now (a pull of no blocks is how vLLM's
            # consumer frees them after a local prefix hit), not after its abort timeout.
            release = {req_id: dataclasses.replace(
                meta, local_block_ids=[[] for _ in meta.local_block_ids],
                pull_tasks_count=0, failed=False) for req_id, meta in pull_metas.items()}
            self._handle_failed_recv(
                pull_metas, list(pull_metas),
                f"the prefill instance runs tensor parallel size {remote_tp} and this decode "
                f"instance {self.tp_size}: on the NPU's KV layout (heads inside each token "
                "of a block) a prefill rank cannot send a decode rank its heads as whole "
                "blocks; run the prefill instance with a TP size >= the decode instance's")
            super().receive_kv(remote_engine_id, release)
            return
        super().receive_kv(remote_engine_id, pull_metas)

    async def receive_kv_from_single_worker(self, worker_addr: str, pull_metas: dict):
        # A dead prefill worker fails the pull in seconds (liveness.py), not in
        # VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60 s.
        await watch_peer(super().receive_kv_from_single_worker(worker_addr, pull_metas),
                         worker_addr, self._probe_interval_s, self._probe_misses)

    def get_finished(self) -> tuple[set[str] | None, set[str] | None]:
        done_sending, done_recving = super().get_finished()
        for req_id in done_recving or ():
            with self._pulls_lock:
                pull = self._pulls.pop(req_id, None)
            if pull is None:
                continue
            engine_id, block_ids = pull
            splits = self._producer_splits(engine_id)
            if splits > 1:
                self._reorder(block_ids, splits)
        return done_sending, done_recving

    def _send_blocks(self, remote_session: str, src_ptrs: list[int], dst_ptrs: list[int],
                     lengths: list[int]) -> int:
        """Retries of a failed write, each on a fresh connection, before the request fails.
        Mooncake 0.3.13's TCP transport can stall a write until its timeout (TCP_STALL_S) when two
        producer ranks (a TP=2 prefill) write to one decode instance at once: the
        receiver stops draining both connections, the client drops them and reports -1
        (tests/e2e/test_pd_disagg.py, 2P1D: 2 of 8 runs on loopback, both ranks at once,
        the pool on or off); a write on a new connection then goes through. One retry was
        not always enough on a loaded 2-core CI machine (a 2P1D request failed there).
        Rewriting the same bytes to the same addresses is harmless: the decode side learns
        of the blocks only from the notification sent after the write returns."""
        ret = super()._send_blocks(remote_session, src_ptrs, dst_ptrs, lengths)
        for attempt in range(2, WRITE_ATTEMPTS + 1):
            if ret == 0:
                break
            logger.warning("Retrying the write of %d bytes to %s (attempt %d of %d)",
                           sum(lengths), remote_session, attempt, WRITE_ATTEMPTS)
            # The transport reconnects a dropped lane only after a 1 s cooldown; a retry
            # sent sooner failed at once (seen: 60 us after the 5 s stall).
            time.sleep(RETRY_PAUSE_S)
            ret = super()._send_blocks(remote_session, src_ptrs, dst_ptrs, lengths)
        return ret

    def _reorder(self, block_ids: list[list[int]], splits: int) -> None:
        group_by_layer = self.kv_cache_config.transfer_group_index_by_layer
        for layer_name, cache in self.device_kv_caches.items():
            group = group_by_layer.get(layer_name)
            if group is None:
                continue
            for slot in range(cache.shape[1]):  # [num_blocks, 2 (K, V), block_size, C]
                reorder_split_blocks(cache[:, slot], block_ids[group], splits)


class MooncakeConnector(upstream.MooncakeConnector):
    """vLLM's MooncakeConnector with the NPU worker; the platform routes
    `--kv-transfer-config '{"kv_connector": "MooncakeConnector", ...}'` here."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig):
        # The upstream constructor builds its own worker class; only that line differs.
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
        self.engine_id = vllm_config.kv_transfer_config.engine_id
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = upstream.MooncakeConnectorScheduler(
                vllm_config, self.engine_id, kv_cache_config)
            self.connector_worker = None
        else:
            self.connector_scheduler = None
            self.connector_worker = NPUMooncakeConnectorWorker(
                vllm_config, self.engine_id, kv_cache_config)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        # Upstream asks for LBHNC (head-major blocks) for heterogeneous TP; the NPU backends
        # keep their kernels' layout and the worker above handles heterogeneous TP instead.
        return None
