"""The worker freezes the heap the imports left before vLLM's startup collections run
(worker.py `init_device` calls vLLM's `freeze_gc_heap`): model loading, memory profiling
and graph capture each collect the whole heap, which then skips the frozen part."""
from __future__ import annotations

import gc
import weakref

import pytest

from tests.helpers.engine import make_llm, shutdown

pytestmark = pytest.mark.usefixtures("real_gc_freeze")  # the test process stubs them


def _tracked(obj) -> bool:
    """obj is in one of the collector's generations (a frozen object is in none)."""
    return any(o is obj for o in gc.get_objects())


def test_the_startup_freeze_frees_cycles_then_freezes_what_lives():
    from vllm.utils.gc_utils import freeze_gc_heap

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    garbage = weakref.ref(a)
    del a, b  # unreachable, held only by their reference cycle
    alive = [object()]
    assert _tracked(alive)
    try:
        freeze_gc_heap()
        assert garbage() is None  # collected before the freeze, not frozen with the rest
        assert not _tracked(alive)
    finally:
        gc.unfreeze()


def test_the_worker_freezes_the_heap_before_the_model_loads(tiny_models, parity_dtype,
                                                            monkeypatch):
    from vllm_npu.worker.worker import NPUWorker

    before_engine = [object()]  # made after any earlier engine froze the heap
    seen = {}
    load_model = NPUWorker.load_model

    def spy(self, *args, **kwargs):
        seen["frozen"] = not _tracked(before_engine)
        return load_model(self, *args, **kwargs)

    monkeypatch.setattr(NPUWorker, "load_model", spy)
    llm = make_llm(tiny_models["qwen2"], parity_dtype, enforce_eager=True)
    shutdown(llm)
    assert seen == {"frozen": True}
