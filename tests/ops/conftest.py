"""Small-shape op tests run single-threaded (the `single_torch_thread` fixture)."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(single_torch_thread):
    yield
