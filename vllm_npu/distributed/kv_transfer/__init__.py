"""KV transfer between vLLM instances (prefill/decode disaggregation) on the NPU."""
