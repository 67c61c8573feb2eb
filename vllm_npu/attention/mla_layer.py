"""vLLM's MLA layer wrapper with DeepSeek-V3.2's indexer on the NPU (a layer, kept beside
the attention backends it configures).

`MultiHeadLatentAttentionWrapper` is a PluggableLayer: this subclass replaces it out of
tree and, for sparse (DSA) models only, swaps the layer's indexer for
`dsa_indexer.NPUIndexer` (vLLM's fp8 / DeepGEMM indexer path cannot run on an NPU). The
forward is vLLM's own; dense MLA models are untouched.
"""
from __future__ import annotations

from vllm.config import get_current_vllm_config
from vllm.model_executor.custom_op import PluggableLayer
from vllm.model_executor.layers.mla import MultiHeadLatentAttentionWrapper

from vllm_npu.attention.dsa_indexer import NPUIndexer


@PluggableLayer.register_oot(name="MultiHeadLatentAttentionWrapper")
class NPUMultiHeadLatentAttention(MultiHeadLatentAttentionWrapper):

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_sparse:
            return
        config = get_current_vllm_config()
        if config.speculative_config is not None:
            raise NotImplementedError(
                "vllm_npu: DeepSeek-V3.2 sparse attention with speculative decoding (MTP "
                "shares the indexer's picks across draft steps) is not supported on the NPU "
                "yet; serve the model without --speculative-config")
        if self.indexer is not None:
            self.indexer = NPUIndexer(self.indexer, config.model_config.dtype)
