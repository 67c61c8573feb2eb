"""Quantised checkpoints on the NPU: ModelSlim's W8A8 / W8A8_DYNAMIC (`--quantization ascend`)."""
