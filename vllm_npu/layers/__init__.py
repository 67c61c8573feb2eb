"""CustomOp out-of-tree layers: vLLM's norm / rotary / activation through the NPU op surface."""
