"""How `make test` shares the suite between its pytest-xdist workers (`-n 2`).

Run one after another, the suite left a fifth of this machine's two cores idle (measured
2026-12-07: 667 idle core-seconds in a 1,710 s run): an in-process engine compiles and
captures its graphs on one Python thread, and a served test waits while its servers import
vLLM on one core each. Two workers fill each other's gaps. Each worker takes whole files
(module-scoped engines are built once, in one worker), the longest first so that no long
file starts last; files that start Ray clusters or network namespaces run in one worker,
one after another. Each worker computes with its share of the cores (tests/conftest.py).
"""
from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# Seconds each file took in a serial run (2026-12-07, 1217002). Only the order depends on
# them: a stale figure costs minutes at the end of a run, never a result.
SECONDS = {
    "tests/benchmarks/test_scripts.py": 1000,  # first: the soak's 2 minutes start with it
    "tests/e2e/test_architectures.py": 252, "tests/e2e/test_ray_nodes.py": 104,
    "tests/e2e/test_pd_disagg.py": 98, "tests/e2e/test_ray.py": 92,
    "tests/e2e/test_parallel.py": 79, "tests/e2e/test_pd_serving.py": 70,
    "tests/e2e/test_moe_parity.py": 66, "tests/test_packaging.py": 64,
    "tests/e2e/test_defaults.py": 64, "tests/e2e/test_context_parallel.py": 54,
    "tests/e2e/test_vlm.py": 53, "tests/ops/test_sim_memory.py": 48,
    "tests/e2e/test_server.py": 47, "tests/test_upstream_harness.py": 47,
    "tests/e2e/test_eplb_runtime.py": 41, "tests/e2e/test_device_dtype_parity.py": 36,
    "tests/eplb/policy/test_policies.py": 31, "tests/e2e/test_pooling.py": 29,
    "tests/distributed/test_collectives.py": 27, "tests/e2e/test_quantized_tp.py": 26,
    "tests/e2e/test_quantized.py": 25, "tests/eplb/policy/test_lookahead_bound.py": 24,
    "tests/e2e/test_pd_link.py": 20, "tests/plugin/test_selection_and_config.py": 19,
    "tests/e2e/test_hybrid_models.py": 18, "tests/e2e/test_graph_modes.py": 16,
    "tests/ops/test_attention_ops.py": 14,
}

# Files that share one worker, one after another: each starts Ray clusters or network
# namespaces (tests/helpers/ray_nodes.py), and two at once would only contend.
TOGETHER = {path: "ray-and-netns" for path in (
    "tests/e2e/test_ray.py", "tests/e2e/test_ray_nodes.py", "tests/e2e/test_pd_link.py",
    "tests/distributed/test_ray_executor.py", "tests/distributed/test_hosts.py")}


def unit(nodeid: str) -> str:
    """The work unit a test belongs to: its file, or the group its file runs in."""
    path = nodeid.split("::", 1)[0]
    return TOGETHER.get(path, path)


def cost(nodeid: str) -> float:
    path = nodeid.split("::", 1)[0]
    if path in TOGETHER:
        return sum(SECONDS.get(p, 0) for p in TOGETHER)
    return SECONDS.get(path, 0)


def order(items: list) -> None:
    """Sort ``items`` in place, units of the longest first (each worker sorts its identical
    collection the same way; the scheduler hands units out in that order)."""
    first_seen = {}
    for i, item in enumerate(items):
        first_seen.setdefault(unit(item.nodeid), i)
    items.sort(key=lambda item: (-cost(item.nodeid), first_seen[unit(item.nodeid)]))


class FileScheduling(LoadScopeScheduling):
    """xdist's per-scope scheduling with files (or their group) as scopes, in collection
    order (:func:`order`)."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep :func:`order`'s order

    def _split_scope(self, nodeid: str) -> str:
        return unit(nodeid)
