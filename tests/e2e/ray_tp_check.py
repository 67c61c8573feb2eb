"""Run inside a private network namespace (see test_ray.py): a one-node Ray cluster whose
node advertises NPU resources, TP=2 through vLLM's Ray executor; prints one JSON line."""
from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["VLLM_HOST_IP"] = "127.0.0.1"


def _visible_devices(worker) -> str:
    return os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")


def main(model: str) -> None:
    import ray

    from tests.helpers.engine import generate, make_llm, shutdown, vocab
    from tests.helpers.reference import hf_greedy, random_prompt

    ray.init(address="local", num_cpus=2, resources={"NPU": 2}, include_dashboard=False,
             _node_ip_address="127.0.0.1")
    prompts = [random_prompt(70 + i, 20 + 40 * i, vocab(model)) for i in range(2)]
    llm = make_llm(model, "float32", tensor_parallel_size=2,
                   distributed_executor_backend="ray", enable_sleep_mode=False)
    try:
        got = generate(llm, prompts, 12)
        devices = sorted(llm.collective_rpc(_visible_devices))
    finally:
        shutdown(llm)
        ray.shutdown()
    print(json.dumps({"match": got == [hf_greedy(model, p, 12) for p in prompts],
                      "devices": devices}))


if __name__ == "__main__":
    main(sys.argv[1])
