"""Seeded sampling with chunked prefill on the simulated NPU: CPU generators have no
Philox offset.

vLLM's runner undoes the sample of a request whose prefill chunk was partial (that token
is discarded) by moving its generator back one draw, `gen.set_offset(gen.get_offset() -
4)` (`GPUModelRunner._bookkeeping_sync`): Philox offsets, which CUDA's and torch_npu's
generators have (vllm-ascend's runner does the same). The simulated NPU's generators are
CPU (mt19937) ones, whose `set_offset` raises "CPU Generator does not use offset": any
seeded request with a chunked prefill stopped the engine. Here the runner keeps, before
sampling, the state of each CPU generator whose sample will be discarded (vLLM's
`discard_request_mask`, set while preparing inputs) and restores it afterwards: the same
rewind by other means; vLLM's own rewind then skips them.
"""
from __future__ import annotations

import numpy as np


class CPUGeneratorRewind:
    """Mixed into the NPU model runner (before GPUModelRunner)."""

    _pre_sample_states: dict = {}

    def _discarded_cpu_generators(self) -> dict:
        """Index -> generator of this step's discarded samples (partial prefills) that
        draw from a CPU generator; usually none, so the common step copies nothing."""
        gens = self.input_batch.generators
        if not gens:
            return {}
        rows = np.nonzero(self.discard_request_mask.np[:self.input_batch.num_reqs])[0]
        return {int(i): gens[int(i)] for i in rows
                if int(i) in gens and gens[int(i)].device.type == "cpu"}

    def _sample(self, logits, spec_decode_metadata):
        self._pre_sample_states = {i: g.get_state()
                                   for i, g in self._discarded_cpu_generators().items()}
        return super()._sample(logits, spec_decode_metadata)

    def _bookkeeping_sync(self, *args, **kwargs):
        gens, states = self.input_batch.generators, self._pre_sample_states
        for i, state in states.items():
            gens[i].set_state(state)
        rewound = {i: gens.pop(i) for i in states}  # vLLM's Philox rewind skips them
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            gens.update(rewound)
            self._pre_sample_states = {}
