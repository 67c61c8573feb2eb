"""TP=2 through vLLM's Ray executor on a local Ray cluster whose node advertises NPU
resources; Ray hands each worker its NPU through ASCEND_RT_VISIBLE_DEVICES. Ray listens on
every interface, so the run happens in a private network namespace with only loopback."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _netns_available() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _netns_available(), reason="needs root + unshare for a private netns")
def test_tensor_parallel_over_ray_matches_hf(tiny_models, parity_dtype):
    pytest.importorskip("ray")
    script = (f"ip link set lo up && cd {REPO} && "
              f"{sys.executable} -m tests.e2e.ray_tp_check {tiny_models['llama']}")
    res = subprocess.run(["unshare", "--net", "bash", "-c", script], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["match"] is True
    assert result["devices"] == ["0", "1"]  # one NPU per worker, assigned by Ray
