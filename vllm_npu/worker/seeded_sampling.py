"""Seeded sampling with chunked prefill on the simulated NPU: CPU generators have no
Philox offset.

vLLM's runner undoes the sample of a request whose prefill chunk was partial (that token
is discarded) by moving its generator back one draw, `gen.set_offset(gen.get_offset() -
4)` (`GPUModelRunner._bookkeeping_sync`): Philox offsets, which CUDA's and torch_npu's
generators have (vllm-ascend's runner does the same). The simulated NPU's generators are
CPU (mt19937) ones, whose `set_offset` raises "CPU Generator does not use offset": any
seeded request with a chunked prefill stopped the engine. Here the runner keeps each CPU
generator's state from before the sampling step and restores it for the discarded
requests, the same rewind by other means; vLLM's own rewind then skips them.
"""
from __future__ import annotations

import numpy as np


class CPUGeneratorRewind:
    """Mixed into the NPU model runner (before GPUModelRunner)."""

    _pre_sample_states: dict = {}

    def _sample(self, logits, spec_decode_metadata):
        self._pre_sample_states = {i: g.get_state()
                                   for i, g in self.input_batch.generators.items()
                                   if g.device.type == "cpu"}
        return super()._sample(logits, spec_decode_metadata)

    def _bookkeeping_sync(self, *args, **kwargs):
        gens, states = self.input_batch.generators, self._pre_sample_states
        num_reqs = self.input_batch.num_reqs
        discarded = [int(i) for i in np.nonzero(self.discard_request_mask.np[:num_reqs])[0]
                     if int(i) in gens and int(i) in states]
        for i in discarded:
            gens[i].set_state(states[i])
        rewound = {i: gens.pop(i) for i in discarded}
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            gens.update(rewound)
