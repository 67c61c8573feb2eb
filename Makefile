# The project's contract: `make serve` and `make test` on a fresh machine.
VENV      ?= .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.vllm_npu-installed
MODEL     ?= models/tiny-llama
HOST      ?= 127.0.0.1
PORT      ?= 8000
SERVE_ARGS ?= --max-model-len 1024

.PHONY: install model serve test upstream-test bench pd-demo

install: $(STAMP)

# Re-runs only when the package metadata or the installer changed.
$(STAMP): pyproject.toml setup.py tools/install.sh tools/fetch_sdist.py $(wildcard csrc/*.c csrc/*.h)
	bash tools/install.sh
	touch $@

$(MODEL)/config.json: | $(STAMP)
	$(PY) -m vllm_npu.testing.tiny_model $(MODEL) --arch llama

model: install $(MODEL)/config.json

serve: model
	$(VENV)/bin/vllm serve $(MODEL) --device npu --host $(HOST) --port $(PORT) \
		--served-model-name tiny-llama $(SERVE_ARGS)

# Prefill/decode disaggregation on this host: 1 prefill + 1 decode instance of the tiny model
# joined by MooncakeConnector (TCP on loopback), behind the router on $(HOST):$(PORT).
pd-demo: model
	$(PY) -m vllm_npu.disagg.launch $(MODEL) --host $(HOST) --port $(PORT) -- \
		--served-model-name tiny-llama $(SERVE_ARGS)

# Two pytest-xdist workers share the suite (tests/helpers/scheduling.py); TEST_WORKERS=0
# runs it in this one process.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# vLLM 0.33.0's own tests against the plugin, per upstream_tests/allowlist.yaml (one process
# per file); UPSTREAM=ci runs the slice .ci/run includes. See docs/upstream_tests.md.
upstream-test: install
	$(PY) -m upstream_tests.run $(UPSTREAM_ARGS)

bench: install
	$(PY) benchmarks/step_overhead.py
	$(PY) benchmarks/throughput_vs_cpu_backend.py
