"""One module per EPLB policy; see :mod:`vllm_npu.eplb.policy` for the registry."""
