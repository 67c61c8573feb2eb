"""The simulated graph runtime is as strict as ACL graphs: replay re-runs the captured
work on the captured buffers, and a task's host arguments stay frozen until updated."""
from __future__ import annotations

import pytest
import torch

from vllm_npu.ops.sim import graph as g
from vllm_npu.ops.sim import graph_aten
from vllm_npu.ops.sim import linear as sim_linear
from vllm_npu.ops.sim.checks import NPUOpError


@g.graph_op
def scale_into(x: torch.Tensor, factor: float, out: torch.Tensor) -> None:
    """A stand-in device op with a host-side argument (`factor`)."""
    out.copy_(x * factor)


@g.graph_op
def shift_into(x: torch.Tensor, by: float, out: torch.Tensor) -> None:
    out.copy_(x + by)


def _capture(fn):
    graph = g.SimGraph()
    graph.capture_begin()
    try:
        result = fn()
    except BaseException:
        graph.capture_end(aborted=True)
        raise
    graph.capture_end()
    return graph, result


def _capture_task(op):
    """A graph whose one task group holds `op()`: (graph, task handle)."""
    def forward():
        g.graph_task_group_begin()
        op()
        return g.graph_task_group_end()

    return _capture(forward)


def _reissue(handle, op):
    """A task update of `handle` whose one call is `op()` (the current stream)."""
    g.graph_task_update_begin(None, handle)
    op()
    g.graph_task_update_end(None)


def test_replay_recomputes_from_the_captured_input_buffers():
    x = torch.ones(4)
    graph, y = _capture(lambda: torch.relu(x * 2) + 1)
    assert torch.equal(y, torch.full((4,), 3.0))
    x.copy_(torch.tensor([1.0, -1.0, 2.0, 0.0]))  # new batch written into the buffer
    graph.replay()
    assert torch.equal(y, torch.tensor([3.0, 1.0, 5.0, 1.0]))  # same output object
    assert graph.replays == 1


def test_replayed_aten_ops_write_their_captured_outputs_in_place(monkeypatch):
    """An aten op with an `out=` overload of the same arguments replays into its captured
    buffer (as a device kernel writes its graph-pool output), `contiguous` and `to` as a
    copy of their input into it; an op with neither runs and is copied in. `linear` and a
    `contiguous` run as launches prepared at capture (the native copy: no dtype change),
    a converting `to` through `_copy_replay`. Results equal a fresh eager run either way.
    (Inference mode, as the engine captures: `linear` stays one op.) Two device cores, as
    on any multi-core host (one core runs `linear` through aten instead)."""
    monkeypatch.setattr(sim_linear.cores, "device_cores", lambda: 2)
    x, w, b = torch.randn(5, 8), torch.randn(6, 8), torch.randn(6)

    def forward():
        h = torch.nn.functional.linear(x, w, b)
        return (h.t().contiguous() + 1.5).relu().to(torch.float64)

    with torch.inference_mode():
        graph, y = _capture(forward)
        kinds = {e.fn.name(): e.out_fn for e in graph.entries}
        assert kinds == {"aten::linear": sim_linear.replay_linear_into,
                         "aten::contiguous": graph_aten.copy_replay,
                         "aten::add.Tensor": torch.ops.aten.add.out,
                         "aten::relu": torch.ops.aten.relu.out,
                         "aten::to.dtype": graph_aten.copy_replay}
        launched = {e.fn.name(): [x.task for x in e.launch] for e in graph.entries if e.launch}
        assert launched == {"aten::linear": ["linear"], "aten::contiguous": ["copy"]}
        copies = []
        real_copy = graph_aten.copy_one
        monkeypatch.setattr(graph_aten, "copy_one", lambda old, new: (copies.append(old),
                                                              real_copy(old, new)))
        x.copy_(torch.randn(5, 8))
        before = y.data_ptr()
        graph.replay()
        assert y.data_ptr() == before and y.dtype == torch.float64
        assert torch.equal(y, forward())
    assert len(copies) == 1  # to's, straight from its input


def test_replayed_matmuls_run_on_the_device_cores_and_the_rest_on_one_thread(monkeypatch):
    """A replay runs its matrix products (mm, bmm, ...) with torch's threads = the
    simulated device's cores and every other op on the host's single thread (vLLM's
    serving setting), which it gets back after each matmul; results equal eager. A
    linear splits its rows over the cores itself: a launch prepared at capture
    (`replay_linear_launch`, run by the replay's program, not as an entry) for that many
    cores, and its result is the one-thread linear's within float32 rounding."""
    from vllm_npu.ops.sim import cores

    x, w, b = torch.randn(64, 32), torch.randn(48, 32), torch.randn(48)
    m = torch.randn(3, 48, 8)

    def forward():
        h = torch.nn.functional.linear(x, w, b).relu()
        return torch.bmm(h.unsqueeze(0).expand(3, -1, -1), m) * 0.5, h @ w

    seen = []
    real_run = g._Entry._run
    monkeypatch.setattr(g._Entry, "_run", lambda self: (
        seen.append((self.fn.name(), torch.get_num_threads())), real_run(self)))
    monkeypatch.setattr(cores, "device_cores", lambda: 3)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            graph, (y, z) = _capture(forward)
            assert [e.matmul for e in graph.entries] == [False, False, True, False, True]
            assert graph.entries[0].out_fn is sim_linear.replay_linear_into
            (launch,) = graph.entries[0].launch
            assert launch.task == "linear" and list(launch.args)[4:] == [64, 48, 32, 3, 0]
            x.copy_(torch.randn(64, 32))
            graph.replay()
            assert torch.get_num_threads() == 1
            torch.testing.assert_close(graph.entries[0].outputs,
                                       torch.nn.functional.linear(x, w, b), rtol=1e-6,
                                       atol=1e-5)
            want_y, want_z = forward()
        # the replayed linear sums in another order than torch's (float32 rounding)
        torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(z, want_z, rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)
    assert seen == [("aten::relu", 1), ("aten::bmm", 3), ("aten::mul.Tensor", 1),
                    ("aten::matmul", 3)]


def test_replayed_row_ops_write_their_captured_outputs_in_place(monkeypatch):
    """The simulated row ops (RMSNorm with and without the residual add, rotary, SwiGLU)
    replay straight into their captured outputs through launches prepared at capture
    (`replay_launch`) when the native kernels cover them (float32): nothing copied, the
    same buffers, results equal to the ops run eagerly on the new inputs. bf16 is not
    covered: run and copied in."""
    from vllm_npu.ops import sim
    from vllm_npu.ops.sim import native

    if native.library() is None:
        pytest.skip("no native kernels library (install without a C compiler)")

    def inputs(dtype):
        return [torch.randn(6, 16, dtype=dtype), torch.randn(6, 16, dtype=dtype),
                torch.randn(16, dtype=dtype), torch.randn(1, 6, 2, 16, dtype=dtype),
                torch.randn(1, 6, 1, 16, dtype=dtype), torch.randn(1, 6, 1, 16, dtype=dtype)]

    def forward(x1, x2, gamma, q, cos, sin):
        y, _, xsum = sim.npu_add_rms_norm(x1, x2, gamma, 1e-6)
        z, rstd = sim.npu_rms_norm(xsum, gamma, 1e-5)
        return y, z, rstd, sim.npu_rotary_mul(q, cos, sin), sim.npu_swiglu(torch.cat([y, z], -1))

    for dtype, copied in ((torch.float32, 0), (torch.bfloat16, 3 + 2 + 1 + 1)):
        buffers = inputs(dtype)
        with torch.inference_mode():
            graph, outs = _capture(lambda: forward(*buffers))
            covered = [e for e in graph.entries
                       if e.launch is not None and e.fn.__name__.startswith("npu_")]
            assert len(covered) == (4 if dtype == torch.float32 else 0)
            (cat,) = [e for e in graph.entries if e.fn is torch.ops.aten.cat.default]
            assert [x.task for x in cat.launch] == ["copy", "copy"]  # into its two slices
            copies = []
            real_copy = graph_aten.copy_one
            monkeypatch.setattr(graph_aten, "copy_one", lambda old, new: (copies.append(old),
                                                                  real_copy(old, new)))
            for buf, new in zip(buffers, inputs(dtype)):
                buf.copy_(new)
            ptrs = [t.data_ptr() for t in outs]
            graph.replay()
            monkeypatch.setattr(graph_aten, "copy_one", real_copy)
            assert [t.data_ptr() for t in outs] == ptrs
            for got, want in zip(outs, forward(*buffers)):
                assert torch.equal(got, want)
        # the aten `cat` replays as two prepared copies either way
        assert len(copies) == copied, dtype


def test_prepared_launches_run_as_one_program_and_follow_memory_that_moved(mocker,
                                                                           monkeypatch):
    """Consecutive entries with prepared launches replay as one native call (one
    program); a weight whose storage moved since capture (sleep mode frees and restores
    storages in place, worker/sleep.py) is prepared again from the entry's tensors, and
    one smaller than at capture is refused before any kernel runs. (Two device cores:
    `linear` is a prepared launch only on more than one.)"""
    from vllm_npu.ops import sim
    from vllm_npu.ops.sim import native

    if native.library() is None:
        pytest.skip("no native kernels library (install without a C compiler)")
    monkeypatch.setattr(sim_linear.cores, "device_cores", lambda: 2)
    x, gamma = torch.randn(16, 32), torch.randn(32)
    w = torch.randn(24, 32)

    def forward():
        y, _ = sim.npu_rms_norm(x, gamma, 1e-6)
        return torch.nn.functional.linear(y, w)

    def want():
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
        return y @ w.t()

    with torch.inference_mode():
        graph, out = _capture(forward)
        runs = mocker.spy(native.LaunchList, "__call__")
        x.copy_(torch.randn(16, 32))
        graph.replay()
        assert runs.call_count == 1
        (program,) = graph._plan[0]
        assert [x.task for x in program.launches.launches] == ["rms_norm", "linear"]
        torch.testing.assert_close(out, want(), rtol=1e-5, atol=1e-5)
        saved = w.clone()
        storage = w.untyped_storage()
        before = storage.data_ptr()
        storage.resize_(0)  # asleep: a replay now would read freed memory
        with pytest.raises(NPUOpError, match="now holds 0"):
            graph.replay()
        storage.resize_(saved.numel() * 4 + (1 << 20))  # awake, larger: another address
        assert storage.data_ptr() != before
        w.copy_(saved * 2)
        graph.replay()
        torch.testing.assert_close(out, want(), rtol=1e-5, atol=1e-5)


def _asleep_then_awake_elsewhere(t: torch.Tensor, scale: float) -> None:
    """Sleep mode on a float32 tensor (worker/sleep.py resizes storages in place): its
    storage freed, then re-allocated larger, so at another address, holding its old values
    x ``scale``."""
    saved = t.clone()
    storage = t.untyped_storage()
    before = storage.data_ptr()
    storage.resize_(0)
    storage.resize_(saved.numel() * 4 + (1 << 20))
    assert storage.data_ptr() != before
    t.copy_(saved * scale)


def test_a_graph_first_replayed_after_its_memory_moved_is_prepared_again():
    """A graph captured, never replayed, then its weight's storage moved (sleep and wake
    up): the first replay's plan must see the launches' capture-time address is stale
    (found as a graph first replayed after a sleep decoding zeros)."""
    from vllm_npu.ops.sim import native

    if native.library() is None:
        pytest.skip("no native kernels library (install without a C compiler)")
    x, w = torch.randn(16, 32), torch.randn(24, 32)
    with torch.inference_mode():
        graph, out = _capture(lambda: torch.nn.functional.linear(x, w))
        _asleep_then_awake_elsewhere(w, scale=3)
        graph.replay()
        torch.testing.assert_close(out, x @ w.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("alias", ["data", "view", "in_place"])
def test_memory_reached_through_a_captured_alias_is_checked_for_moves(alias):
    """A weight the capture reached through an alias (NPURMSNorm passes `weight.data`: a
    view recorded as a static call; or an in-place op's output, which is its input) is
    outside the graph's own memory: when sleep mode moves it alone, the launches are
    prepared again. (Found as decodes turning to token 0 after a level-2 sleep, only when
    every other weight came back at its old address.)"""
    from vllm_npu.ops import sim
    from vllm_npu.ops.sim import native

    if native.library() is None:
        pytest.skip("no native kernels library (install without a C compiler)")
    x, gamma = torch.randn(16, 32), torch.randn(32)
    reach = {"data": lambda: gamma.data, "view": lambda: gamma.view(32),
             "in_place": lambda: gamma.mul_(1.0)}[alias]
    with torch.inference_mode():
        graph, out = _capture(lambda: sim.npu_rms_norm(x, reach(), 1e-6)[0])
        graph.replay()
        _asleep_then_awake_elsewhere(gamma, scale=2)
        graph.replay()
        want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_gathers_copies_and_id_conversions_replay_as_prepared_launches():
    """`embedding`, `index_select` along dim 0, `cat` and an int32 -> int64 `to` are
    prepared at capture (gather and copy tasks of the native program); a replay reads the
    new ids and rows; an index outside its table at replay is refused with aten's own
    IndexError before that gather writes anything (as the kernels before it ran, the
    device's tasks before a failing one have run)."""
    from vllm_npu.ops.sim import native

    if native.library() is None:
        pytest.skip("no native kernels library (install without a C compiler)")
    weight, table = torch.randn(10, 8), torch.randn(20, 4)
    ids = torch.tensor([1, 3, 5], dtype=torch.int32)
    pos = torch.tensor([0, 7, 19])

    def forward():
        e = torch.nn.functional.embedding(ids.to(torch.int64), weight)
        return torch.cat([e, table.index_select(0, pos)], -1)

    with torch.inference_mode():
        graph, out = _capture(forward)
        tasks = {e.fn.name(): [x.task for x in e.launch] for e in graph.entries if e.launch}
        assert tasks == {"aten::to.dtype": ["copy"], "aten::embedding": ["gather_rows"],
                         "aten::index_select": ["gather_rows"], "aten::cat": ["copy", "copy"]}
        ids.copy_(torch.tensor([9, 0, 2], dtype=torch.int32))
        pos.copy_(torch.tensor([5, 5, 1]))
        graph.replay()
        assert torch.equal(out, forward())
        before = out.clone()
        pos[1] = 20
        with pytest.raises(IndexError, match="index out of range in self"):
            graph.replay()
        assert torch.equal(out, before)  # the cat after the refused gather did not run


def test_host_work_inside_a_capture_is_not_replayed():
    """Ops on host tensors (sizing a workspace from host lengths) run once at capture, as
    on a device, where CPU-tensor ops never become graph tasks; the device ops around them
    are recorded and replayed. Outside a capture host_work changes nothing."""
    x, lens = torch.ones(4), torch.tensor([3, 5], dtype=torch.int32)

    def forward():
        with g.host_work():
            longest = int(torch.full_like(lens, 7).max())
        return x * longest

    graph, y = _capture(forward)
    assert len(graph.entries) == 1 and torch.equal(y, torch.full((4,), 7.0))
    x.fill_(2.0)
    graph.replay()
    assert torch.equal(y, torch.full((4,), 14.0))
    with g.host_work():
        assert torch.equal(lens + 1, torch.tensor([4, 6], dtype=torch.int32))


def test_views_and_allocations_are_not_replayed_but_stay_valid():
    """A device graph records kernels only: views of captured buffers and capture-time
    allocations run no work at replay, yet the buffers they name stay alive and right."""
    x = torch.arange(8.0)
    w = torch.nn.Parameter(torch.eye(4))  # a parameter subclass among the arguments

    def forward():
        out = torch.empty(2, 4)  # an allocation, written by a task below
        rows = x.view(2, 4)  # a view of the input buffer
        g.graph_task_group_begin()
        scale_into(rows @ w, 3.0, out)
        g.graph_task_group_end()
        return out.t(), rows[:, :2].contiguous()  # a view, and a copy (strided input)

    graph, (out_t, head) = _capture(forward)
    names = [getattr(e.fn, "__name__", "") for e in graph.entries]
    assert names == ["mm.default", "scale_into", "clone.default"], names
    x.copy_(torch.arange(8.0, 16.0))
    graph.replay()
    torch.testing.assert_close(out_t, (torch.arange(8.0, 16.0).view(2, 4) * 3).t())
    torch.testing.assert_close(head, torch.arange(8.0, 16.0).view(2, 4)[:, :2])


def test_task_arguments_stay_frozen_until_updated():
    x, out = torch.ones(3), torch.zeros(3)

    graph, handle = _capture_task(lambda: scale_into(x, 2.0, out))
    assert torch.equal(out, torch.full((3,), 2.0))
    graph.replay()  # no update: the capture's host argument is replayed (stale)
    assert torch.equal(out, torch.full((3,), 2.0))
    g.graph_task_update_begin(None, handle)
    assert scale_into(x, 5.0, out) is None  # captured into the task, not executed
    g.graph_task_update_end(None)
    assert torch.equal(out, torch.full((3,), 2.0))
    graph.replay()
    assert torch.equal(out, torch.full((3,), 5.0)) and handle.updates == 1


def test_ops_outside_task_groups_are_frozen_entries():
    x, out = torch.ones(2), torch.zeros(2)
    graph, _ = _capture(lambda: scale_into(x, 3.0, out))
    x.fill_(2.0)
    graph.replay()
    assert torch.equal(out, torch.full((2,), 6.0))  # new data, frozen host argument


def test_update_must_reissue_the_same_op():
    x, out = torch.ones(2), torch.zeros(2)

    _, handle = _capture_task(lambda: scale_into(x, 2.0, out))
    g.graph_task_update_begin(None, handle)
    shift_into(x, 1.0, out)
    with pytest.raises(NPUOpError, match=r"captured \['scale_into'\], got \['shift_into'\]"):
        g.graph_task_update_end(None)


def test_misuse_is_refused():
    with pytest.raises(RuntimeError, match="outside graph capture"):
        g.graph_task_group_begin()
    with pytest.raises(RuntimeError, match="without graph_task_update_begin"):
        g.graph_task_update_end()
    graph = g.SimGraph()
    graph.capture_begin()
    try:
        with pytest.raises(RuntimeError, match="already capturing"):
            g.SimGraph().capture_begin()
        with pytest.raises(RuntimeError, match="cannot replay while a graph is capturing"):
            graph.replay()
    finally:
        graph.capture_end()
    with pytest.raises(NPUOpError, match="no task update recorded"):
        g.ExternalEvent().wait()


def test_an_external_event_is_captured_as_wait_and_reset_nodes():
    """torch_npu's protocol (test_aclgraph_update.py): wait and reset captured into the
    graph, a record per replay; the captured reset re-arms the wait, so a second replay
    without a new record is refused (a device would wait forever)."""
    x = torch.ones(3)
    event, graph = g.ExternalEvent(), g.SimGraph()
    graph.capture_begin()
    try:
        event.wait(g.current_stream())  # recorded nowhere yet: not checked at capture
        event.reset(g.current_stream())
        y = x * 2
    finally:
        graph.capture_end()
    x.fill_(5)
    event.record()
    graph.replay()
    assert y.tolist() == [10.0] * 3 and not event.recorded
    with pytest.raises(NPUOpError, match="no task update recorded since its reset"):
        graph.replay()
    event.record()
    graph.replay()


def test_the_update_stream_runs_only_task_relaunches_and_host_work():
    """A device op on the graph-update stream would run unordered with the compute stream
    that wrote its inputs: refused; views, allocations, declared host work and the op
    surface's re-issued calls pass."""
    table = torch.arange(6, dtype=torch.int32).view(2, 3)
    with g.use_stream(g.SimStream()):
        padded = table.new_zeros(4, 3)        # an allocation
        assert table[0].shape == (3,)         # a view
        with g.host_work():
            lens = [int(v) for v in table[:, 0]]
        with pytest.raises(NPUOpError, match="clamp_ issued on the graph-update stream"):
            padded.clamp_(min=0)
        with pytest.raises(NPUOpError, match="__setitem__ issued on the graph-update"):
            padded[:2] = table
    assert lens == [0, 3]
    padded[:2] = table  # on the compute stream: fine


def _paged_decode_inputs():
    g_ = torch.Generator().manual_seed(0)
    blocks, bs, hkv, heads, d, batch = 6, 16, 2, 4, 32, 3
    key = torch.randn(blocks, bs, hkv, d, generator=g_)
    value = torch.randn(blocks, bs, hkv, d, generator=g_)
    query = torch.randn(batch, heads, d, generator=g_)
    table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    lens = torch.tensor([5, 20, 31], dtype=torch.int32)  # vLLM's persistent host buffer
    return query, key, value, table, lens, (hkv, heads, d ** -0.5)


def _paged(query, key, value, table, lens, consts, out, workspace=None):
    from vllm_npu.ops import sim

    hkv, heads, scale = consts
    if workspace is None:
        workspace = _PAGED_WORKSPACE  # sized for the block table's longest context
    sim._npu_paged_attention(query, key, value, hkv, heads, scale, table, lens, out,
                             workspace=workspace)


_PAGED_WORKSPACE = torch.empty(1 << 16, dtype=torch.uint8)


def test_host_lengths_are_copied_into_the_task_at_capture_and_update():
    """vLLM rewrites its host seq-lens buffer in place every step; a replayed paged
    attention task keeps the lengths it was captured (or last updated) with."""
    query, key, value, table, lens, consts = _paged_decode_inputs()
    out = torch.empty_like(query)

    graph, handle = _capture_task(lambda: _paged(query, key, value, table, lens, consts, out))
    captured = out.clone()
    lens.copy_(torch.tensor([9, 3, 17], dtype=torch.int32))  # next step, in place
    want_new = torch.empty_like(query)
    _paged(query, key, value, table, lens, consts, want_new)
    assert not torch.equal(want_new, captured)
    graph.replay()
    assert torch.equal(out, captured)  # the capture's lengths, not the buffer's
    g.graph_task_update_begin(None, handle)
    _paged(query, key, value, table, lens, consts, out)
    g.graph_task_update_end(None)
    lens.fill_(1)  # changes after the update are not seen either
    graph.replay()
    assert torch.equal(out, want_new)


def test_fia_out_host_lists_are_copied_into_the_task():
    from vllm_npu.ops import sim

    g_ = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 16, generator=g_)  # TND: 2 decode tokens
    key = torch.randn(4, 128, 2 * 16, generator=g_)
    value = torch.randn(4, 128, 2 * 16, generator=g_)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    q_ends, kv_lens = [1, 2], [7, 200]

    def run(out):
        sim.npu_fused_infer_attention_score_out(
            q, key, value, out=out, actual_seq_lengths=q_ends, actual_seq_lengths_kv=kv_lens,
            block_table=table, num_heads=2, num_key_value_heads=2, scale=0.25,
            input_layout="TND", block_size=128, sparse_mode=0, softmax_lse_flag=True)
        return out

    out = [torch.empty(2, 2, 16), torch.empty(2, 2, 1)]
    graph, _ = _capture(lambda: run(out))
    captured = out[0].clone()
    kv_lens[1] = 12  # the caller reuses its list
    graph.replay()
    assert torch.equal(out[0], captured)
    eager = run([torch.empty(2, 2, 16), torch.empty(2, 2, 1)])  # what the new list gives
    assert not torch.equal(eager[0], captured)


def test_an_update_takes_only_the_ops_issued_on_its_stream():
    """Issued on another stream, the op runs at once (with the new arguments) and the
    update window stays empty: refused at graph_task_update_end, as the count mismatch a
    device reports. On the update stream it becomes the task's new call."""
    x, out = torch.ones(3), torch.zeros(3)

    graph, handle = _capture_task(lambda: scale_into(x, 2.0, out))
    update_stream = g.SimStream()
    g.graph_task_update_begin(update_stream, handle)
    scale_into(x, 7.0, out)  # on the current (default) stream
    assert torch.equal(out, torch.full((3,), 7.0))  # ran for real
    with pytest.raises(NPUOpError, match="on the update stream.*got \\[\\] on that stream"):
        g.graph_task_update_end(update_stream)
    g.graph_task_update_begin(update_stream, handle)
    with g.use_stream(update_stream):
        assert scale_into(x, 5.0, out) is None
    g.graph_task_update_end(update_stream)
    graph.replay()
    assert torch.equal(out, torch.full((3,), 5.0))


# ---- task groups: what a device cannot record or update (#12 items 2 and 3) ----------

def test_a_zero_row_task_is_refused_at_capture():
    """An empty input launches no kernel: the group would hold no task to update."""
    x, out = torch.ones(0, 4), torch.zeros(0, 4)
    with pytest.raises(NPUOpError, match=r"scale_into in a graph task group with a "
                                         r"zero-element x \(0, 4\)"):
        _capture_task(lambda: scale_into(x, 2.0, out))
    graph, _ = _capture(lambda: scale_into(x, 2.0, out))  # outside a task group: allowed
    graph.replay()


@g.graph_op
def doubled(x: torch.Tensor) -> torch.Tensor:
    """A stand-in for a non-out variant: allocates its result."""
    return x * 2


def test_an_op_that_allocates_its_outputs_is_refused_in_a_task_group():
    x = torch.ones(3)
    with pytest.raises(NPUOpError, match="doubled allocates its outputs: inside a graph task "
                                         "group use its out variant"):
        _capture_task(lambda: doubled(x))
    graph, y = _capture(lambda: doubled(x))  # a plain entry: its output is the graph's
    x.fill_(4.0)
    graph.replay()
    assert torch.equal(y, torch.full((3,), 8.0))


def test_an_update_must_keep_the_captured_shapes():
    x, out = torch.ones(4), torch.zeros(4)
    _, handle = _capture_task(lambda: scale_into(x, 2.0, out))
    g.graph_task_update_begin(None, handle)
    scale_into(x[:3], 5.0, out[:3])  # a smaller batch than captured
    with pytest.raises(NPUOpError, match=r"update of scale_into: out is \(\(3,\), "
                                         r"torch.float32\), captured \(\(4,\), torch.float32\)"):
        g.graph_task_update_end(None)
    assert handle.updates == 0


def test_an_update_must_keep_the_captured_host_list_lengths():
    query, key, value, table, lens, consts = _paged_decode_inputs()
    out = torch.empty_like(query)
    _, handle = _capture_task(lambda: _paged(query, key, value, table, lens, consts, out))
    g.graph_task_update_begin(None, handle)
    _paged(query[:2], key, value, table[:2], lens[:2], consts, out[:2])
    with pytest.raises(NPUOpError, match="update of _npu_paged_attention: block_table"):
        g.graph_task_update_end(None)


def test_a_task_needs_a_workspace_large_enough_for_its_lengths():
    from vllm_npu.ops import sim

    query, key, value, table, lens, (hkv, heads, scale) = _paged_decode_inputs()
    out = torch.empty_like(query)

    def paged(workspace):
        sim._npu_paged_attention(query, key, value, hkv, heads, scale, table, lens, out,
                                 workspace=workspace)

    with pytest.raises(NPUOpError, match="_npu_paged_attention in a graph task needs a "
                                         "workspace"):
        _capture_task(lambda: paged(None))
    short = torch.tensor([1, 1, 1], dtype=torch.int32)
    small = sim._npu_paged_attention_get_workspace(query, key, value, hkv, heads, scale,
                                                   table, short, out)
    with pytest.raises(NPUOpError, match=r"_npu_paged_attention: workspace of \d+ bytes, "
                                         r"the call needs \d+"):
        paged(small)  # sized for one-token contexts, used for contexts up to 31 tokens
    enough = sim._npu_paged_attention_get_workspace(query, key, value, hkv, heads, scale,
                                                    table, lens, out)
    paged(enough)


def test_a_replay_refuses_a_task_whose_update_arguments_were_freed():
    """A task holds addresses: what an update passed must outlive the replay."""
    x, out = torch.ones(3), torch.zeros(3)
    graph, handle = _capture_task(lambda: scale_into(x, 2.0, out))

    def update(source):
        _reissue(handle, lambda: scale_into(source, 3.0, out))

    kept = torch.full((3,), 2.0)
    update(kept)
    graph.replay()
    assert torch.equal(out, torch.full((3,), 6.0))  # reads `kept` through its address
    kept.fill_(5.0)
    graph.replay()
    assert torch.equal(out, torch.full((3,), 15.0))
    update(torch.full((3,), 7.0))  # a temporary, freed when update() returns
    with pytest.raises(NPUOpError, match=r"task scale_into points at a freed torch.float32 "
                                         r"tensor of shape \(3,\)"):
        graph.replay()


def test_a_replay_follows_the_address_an_update_passed_not_the_tensor_object():
    """A task keeps the memory an update passed: a tensor object later re-pointed (`set_`)
    does not move it, a per-update view of live memory stays valid, and the memory freed
    under a still-living tensor object is refused."""
    x, out = torch.ones(3), torch.zeros(3)
    graph, handle = _capture_task(lambda: scale_into(x, 2.0, out))

    def update(source):
        _reissue(handle, lambda: scale_into(source, 3.0, out))

    base = torch.arange(6.0)
    update(base[3:])  # the view dies here, its memory lives in `base`
    graph.replay()
    assert torch.equal(out, torch.tensor([9.0, 12.0, 15.0]))
    source = torch.full((3,), 2.0)
    alias = source.view(3)  # keeps the first memory alive
    update(source)
    source.set_(torch.full((3,), 4.0))  # the object now names other memory
    graph.replay()
    assert torch.equal(out, torch.full((3,), 6.0))  # the task's address: the first memory
    del alias
    with pytest.raises(NPUOpError, match="task scale_into points at a freed"):
        graph.replay()


def test_an_update_call_with_a_bad_argument_name_raises_the_binding_error():
    x, out = torch.ones(3), torch.zeros(3)
    _, handle = _capture_task(lambda: scale_into(x, 2.0, out))
    g.graph_task_update_begin(None, handle)
    try:
        with pytest.raises(TypeError, match="bogus"):
            scale_into(x, 2.0, out, bogus=1)
        scale_into(x=x, factor=4.0, out=out)  # by keyword: the same task call
    finally:
        g.graph_task_update_end(None)
    assert handle.updates == 1


def test_a_paged_attention_task_is_checked_when_issued_and_replayed_as_its_launch(mocker):
    """Like a device runtime, the op's checks run when the task is issued (captured or
    updated) and fix its launch; a replay only launches the kernel (none of the op's host
    code), on the data the addresses hold at replay, with the host lengths of the issue."""
    from vllm_npu.ops.sim import paged_decode

    query, key, value, table, lens, consts = _paged_decode_inputs()
    out = torch.empty_like(query)
    graph, handle = _capture_task(lambda: _paged(query, key, value, table, lens, consts, out))
    assert handle.entries[0].launch is not None
    from vllm_npu.ops.sim import native

    assert [x.task for x in handle.entries[0].launch] == ["paged_decode"]
    op_path = mocker.spy(paged_decode, "paged_decode")
    kernel = mocker.spy(native.LaunchList, "__call__")
    query.mul_(-0.5)  # new device data after the capture: read at replay
    want = torch.empty_like(query)
    _paged(query, key, value, table, lens, consts, want)
    op_path.reset_mock()
    kernel.reset_mock()
    graph.replay()
    assert torch.equal(out, want)
    assert op_path.call_count == 0 and kernel.call_count == 1
    small = torch.empty(1, dtype=torch.uint8)  # a workspace too small for these lengths
    g.graph_task_update_begin(None, handle)
    with pytest.raises(NPUOpError, match=r"_npu_paged_attention: workspace of 1 bytes"):
        _paged(query, key, value, table, lens, consts, out, workspace=small)  # at the issue
    with pytest.raises(NPUOpError, match="must re-issue the captured ops"):
        g.graph_task_update_end(None)  # the refused call is not part of the update
    out.zero_()
    graph.replay()  # the task keeps its previous launch
    assert torch.equal(out, want)


def test_a_reissue_on_the_same_memory_keeps_the_launch_and_checks_the_new_lengths():
    """The decode step's update passes the task's tensors again with new host lengths: the
    task keeps its launch, the checks that read lengths and block ids run at the issue,
    and a refused update leaves the task's previous lengths; other memory is held anew."""
    query, key, value, table, lens, consts = _paged_decode_inputs()
    out = torch.empty_like(query)
    graph, handle = _capture_task(lambda: _paged(query, key, value, table, lens, consts, out))
    entry = handle.entries[0]
    launch, held_lens = entry.launch, entry.args[7]

    def step(new_lens, table=table, out=out):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))  # vLLM's buffer, in place
        _reissue(handle, lambda: _paged(query, key, value, table[:3], lens, consts, out))

    def eager(new_lens):
        want = torch.empty_like(query)
        _paged(query, key, value, table, torch.tensor(new_lens, dtype=torch.int32), consts,
               want)
        return want

    step([9, 3, 17])  # a fresh view of the same table memory is the same argument
    assert entry.launch is launch and entry.args[7] is held_lens
    assert held_lens.tolist() == [9, 3, 17]
    lens.fill_(1)
    graph.replay()
    assert torch.equal(out, eager([9, 3, 17]))
    with pytest.raises(NPUOpError, match=r"context length 33 exceeds the block table "
                                         r"\(2 blocks of 16"):
        step([9, 3, 33])
    with pytest.raises(NPUOpError, match="must re-issue the captured ops"):
        g.graph_task_update_end(None)
    table[1, 0] = 6  # one past the 6-block cache
    with pytest.raises(NPUOpError, match=r"block_table elements must lie in \[0, 6\), "
                                         r"got \[0, 6\]"):
        step([2, 2, 2])
    with pytest.raises(NPUOpError, match="must re-issue the captured ops"):
        g.graph_task_update_end(None)
    table[1, 0] = 2
    out.zero_()
    graph.replay()  # the refused updates left the task as it was
    assert held_lens.tolist() == [9, 3, 17] and torch.equal(out, eager([9, 3, 17]))
    other = torch.zeros_like(out)  # another output: held by address, launched anew
    step([4, 30, 8], out=other)
    assert entry.launch is not launch
    graph.replay()
    assert torch.equal(other, eager([4, 30, 8]))


def test_a_launch_refuses_freed_or_resized_memory_before_running():
    """A prepared launch holds addresses only: an output freed after the update, or a
    cache whose storage was resized (sleep mode frees memory so), is refused at replay
    with the freed-memory error instead of a kernel reading or writing it."""
    query, key, value, table, lens, consts = _paged_decode_inputs()
    out = torch.empty_like(query)
    graph, handle = _capture_task(lambda: _paged(query, key, value, table, lens, consts, out))

    def update(target):
        _reissue(handle, lambda: _paged(query, key, value, table, lens, consts, target))

    update(torch.empty_like(query))  # a temporary output, freed on return
    with pytest.raises(NPUOpError, match="task _npu_paged_attention points at a freed "
                                         r"torch.float32 tensor of shape \(3, 4, 32\)"):
        graph.replay()
    update(out)
    graph.replay()  # valid again once updated with live memory
    plan = graph._plan
    query.mul_(2.0)
    update(out)  # the new launch is patched into the replay's program, not planned again
    assert graph._plan is plan
    graph.replay()
    want = torch.empty_like(query)
    _paged(query, key, value, table, lens, consts, want)
    assert torch.equal(out, want)
    key.untyped_storage().resize_(0)
    with pytest.raises(NPUOpError, match="task _npu_paged_attention points at a freed "
                                         r"torch.float32 tensor of shape \(6, 16, 2, 32\)"):
        graph.replay()


def test_a_cache_write_task_reads_its_slots_at_replay_and_refuses_one_past_the_cache():
    from vllm_npu.ops import sim

    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    k_cache, v_cache = torch.zeros(4, 16, 2, 8), torch.zeros(4, 16, 2, 8)
    slots = torch.tensor([0, 17, -1], dtype=torch.int32)  # -1: a padding token
    graph, handle = _capture_task(
        lambda: sim._npu_reshape_and_cache(key, value, k_cache, v_cache, slots))
    assert handle.entries[0].launch is not None
    k_cache.zero_()
    slots.copy_(torch.tensor([5, -1, 63], dtype=torch.int32))  # device data: read at replay
    graph.replay()
    flat = k_cache.view(64, 2, 8)
    assert torch.equal(flat[5], key[0]) and torch.equal(flat[63], key[2])
    assert torch.equal(v_cache.view(64, 2, 8)[63], value[2])
    assert int((flat.abs().sum(dim=(1, 2)) > 0).sum()) == 2
    k_cache.zero_()
    slots[1] = 64  # one past the cache: nothing is written
    with pytest.raises(NPUOpError, match=r"_npu_reshape_and_cache: slot indices must be < 64"):
        graph.replay()
    assert not k_cache.any()


def test_a_launcher_given_to_the_decorator_form_prepares_the_task():
    """`@graph_op(launcher=...)`: the launcher runs at each issue with the call's
    arguments; a replay runs its launch, not the op."""
    issued, launched, ran = [], [], []

    def launcher(x, factor, out):
        issued.append(factor)
        return lambda: launched.append(factor)

    @g.graph_op(launcher=launcher)
    def scaled(x: torch.Tensor, factor: float, out: torch.Tensor) -> None:
        ran.append(factor)
        out.copy_(x * factor)

    x, out = torch.ones(2), torch.zeros(2)
    graph, handle = _capture_task(lambda: scaled(x, 2.0, out))
    _reissue(handle, lambda: scaled(x, 5.0, out))
    graph.replay()
    assert issued == [2.0, 5.0] and launched == [5.0] and ran == [2.0]  # ran once: capture
