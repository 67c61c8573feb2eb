"""EPLB research tooling that no server runs: workload generators (`workload`, the drift
`families`), the policy benchmarks (`bench`, `bench_families`, `report`) and vllm-ascend's
own policies run side by side as baselines (`ascend_baselines`). The policies themselves
live in `vllm_npu.eplb.policy`; the scripts that run these are `benchmarks/eplb_*.py`."""
