"""Quantise an HF checkpoint into ModelSlim's W8A8 / W8A8_DYNAMIC layout (deterministic).

    python tools/quantize_w8a8.py SRC DST [--scheme W8A8|W8A8_DYNAMIC] [--seed 0]
        [--skip mlp.down_proj ...] [--format modelslim|compressed-tensors]

Serve the result with `vllm serve DST --device npu` (detected: --quantization ascend for
ModelSlim, compressed-tensors from config.json). MoE experts are W8A8_DYNAMIC (ModelSlim).
The formulas and files: vllm_npu/testing/quantize_w8a8.py.
"""
from __future__ import annotations

import argparse

from vllm_npu.testing.quantize_w8a8 import FORMATS, SCHEMES, quantize_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--scheme", choices=SCHEMES, default="W8A8_DYNAMIC")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", nargs="*", default=[],
                        help="name fragments of Linears kept FLOAT (mixed layers)")
    parser.add_argument("--format", choices=FORMATS, default="modelslim")
    args = parser.parse_args()
    print(quantize_checkpoint(args.src, args.dst, args.scheme, args.seed, tuple(args.skip),
                              fmt=args.format))


if __name__ == "__main__":
    main()
