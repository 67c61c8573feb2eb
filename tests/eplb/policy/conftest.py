"""Every EPLB policy test that takes `policy_name` runs once per registered policy."""
from __future__ import annotations

import pytest

from vllm_npu.eplb.policy import available_policies


@pytest.fixture(params=available_policies())
def policy_name(request: pytest.FixtureRequest) -> str:
    return request.param
