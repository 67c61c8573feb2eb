"""One NPU: device init, weights, KV cache sizing and ownership, sleep/wake, execute."""
