"""Small-shape CPU tests: run torch single-threaded.

The shapes here are tiny, so intra-op threads buy nothing, and on a busy 2-core machine
OpenMP workers contending with another process make each op 10x slower. The previous
thread count is restored after every test.
"""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
