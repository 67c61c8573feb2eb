"""How make test's xdist workers share the suite (tests/helpers/scheduling.py) and start the
background runs (tests/helpers/background.py), checked on stand-ins, not on a second run."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from tests.helpers import background, scheduling


def _items(nodeids):
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_units_are_files_and_ray_and_netns_files_share_one():
    assert scheduling.unit("tests/e2e/test_vlm.py::test_a[x-1]") == "tests/e2e/test_vlm.py"
    assert scheduling.unit("tests/e2e/test_pd_disagg.py::TestMLA::test_b") == \
        "tests/e2e/test_pd_disagg.py"
    shared = {scheduling.unit(f"{path}::t") for path in scheduling.TOGETHER}
    assert len(shared) == 1 and shared != {"tests/e2e/test_ray.py"}


def test_order_puts_the_longest_units_first_and_keeps_each_files_tests_in_order():
    ids = ["tests/ops/test_x.py::a", "tests/e2e/test_server.py::a", "tests/ops/test_x.py::b",
           "tests/e2e/test_ray.py::a", "tests/e2e/test_architectures.py::a",
           "tests/e2e/test_server.py::b", "tests/e2e/test_pd_link.py::a",
           "tests/benchmarks/test_scripts.py::a", "tests/ops/test_y.py::a"]
    items = _items(ids)
    scheduling.order(items)
    got = [i.nodeid for i in items]
    assert got == ["tests/benchmarks/test_scripts.py::a",  # the soak starts with it
                   "tests/e2e/test_architectures.py::a",  # 252 s
                   "tests/e2e/test_ray.py::a", "tests/e2e/test_pd_link.py::a",  # one unit
                   "tests/e2e/test_server.py::a", "tests/e2e/test_server.py::b",
                   "tests/ops/test_x.py::a", "tests/ops/test_x.py::b",  # unlisted: as found
                   "tests/ops/test_y.py::a"]
    assert scheduling.cost("tests/e2e/test_ray.py::a") == scheduling.cost(
        "tests/e2e/test_pd_link.py::a") == sum(scheduling.SECONDS.get(p, 0)
                                              for p in scheduling.TOGETHER)


@pytest.fixture
def as_a_worker(monkeypatch, tmp_path):
    monkeypatch.setattr(background, "PARALLEL", True)
    for registry in ("_pending", "_running", "_soon", "_deferred", "_pool"):
        monkeypatch.setattr(background, registry, type(getattr(background, registry))())
    monkeypatch.setenv("NPU_SUITE_TAIL_FILE", str(tmp_path / "tail"))
    yield tmp_path
    background.stop_all()


def test_a_worker_starts_its_runs_when_the_first_result_is_asked_for(as_a_worker):
    folders = []
    for name in ("one", "two", "soak"):
        folders.append(as_a_worker / name)
        folders[-1].mkdir()
    say = [sys.executable, "-c", "import os; print(os.path.basename(os.getcwd()))"]
    background.start_soon("one", say, folders[0])
    background.start_soon("two", say, folders[1])
    background.schedule("soak", say, folders[2], "tests/x.py::test_soak")
    # collected in every worker: nothing runs yet, and there is no single-threaded tail
    assert not background._soon and not background._running
    assert background.tail_start(["tests/e2e/test_a.py::a", "tests/ops/test_b.py::b"]) is None
    first = background.result("two", timeout_s=60)
    assert first.returncode == 0 and first.stdout.strip() == "two"
    assert set(background._soon) == {"one"} and set(background._running) == {"soak"}
    assert background.result("soak", timeout_s=60).stdout.strip() == "soak"
    assert background.result("one", timeout_s=60).stdout.strip() == "one"
    assert background.result("never", timeout_s=1) is None


def test_runs_a_worker_never_started_leave_no_folders(as_a_worker):
    folder = as_a_worker / "bench"
    folder.mkdir()
    background.start_soon("bench", [sys.executable, "-c", "pass"], folder)
    background.stop_all()
    assert not folder.exists() and not background._deferred


def test_parallel_workers_on_npus_are_refused_at_startup(monkeypatch):
    from tests import conftest
    from vllm_npu import device

    monkeypatch.setattr(device, "select_backend",
                        lambda: device.DeviceBackend(False, "torch_npu reports an NPU"))
    config = SimpleNamespace(option=SimpleNamespace(dist="load", numprocesses=2))
    with pytest.raises(pytest.UsageError, match=r"-n 2: on NPUs the suite runs in one "
                       r"process \(make test TEST_WORKERS=0\)"):
        conftest.pytest_configure(config)
    monkeypatch.setattr(device, "select_backend",
                        lambda: device.DeviceBackend(True, "NPU_PLUGIN_SIMULATE=1"))
    conftest.pytest_configure(config)  # the simulated NPU: two workers are fine
    worker = SimpleNamespace(option=config.option, workerinput={})
    assert not background.parallel_controller(worker)
