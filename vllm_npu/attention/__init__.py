"""Attention backends of the NPU plugin: the only code that knows KV layout and seq lens."""
