"""The simulated NPU's graph runtime: capture, replay and task update, as strict as ACL graphs.

On Ascend, a captured graph bakes each kernel's host-side arguments (sequence-length
lists, block tables) into its tasks; replaying with new batch contents is only right if
those tasks were refreshed through `graph_task_update_begin/end`. This module reproduces
that: capture records the forward as a list of entries, replay re-runs them on the
captured buffers, and only a task updated through the update API sees new arguments.

    capture:  aten ops (via a dispatch mode)  -> AtenEntry(func, args, outputs)
              op-surface calls (@graph_op)    -> OpEntry(fn, args, outputs)
              calls inside task_group_begin/end -> the entry belongs to a TaskHandle
    replay:   run the entries in order: kernels prepared at capture / update as one
              native call per run of them (graph_program.py); other entries re-run,
              their results copied into the captured outputs
    update:   between task_update_begin(handle) and task_update_end, op-surface calls
              do not run: they replace the handle's calls (same ops, new arguments; a
              call on the memory its task holds keeps the task's launch, `relaunch`)

A task holds device addresses, not tensors: the simulator keeps a task's device-tensor
arguments by weak reference (task_args.py) and refuses a replay whose task points at
freed memory.
Task groups also refuse what a device cannot record or update: a zero-element input, an
op that allocates its own outputs (a non-`out` variant), a missing workspace, and an
update whose arguments differ in shape from the captured call's.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from vllm_npu.ops.sim import cores, graph_aten, graph_program, native, update_stream
from vllm_npu.ops.sim.aten_launches import OWN_LAUNCH
from vllm_npu.ops.sim.graph_aten import (ALLOCATIONS, MATMULS, OWN_REPLAY, is_static,
                                         out_overload)
from vllm_npu.ops.sim.checks import NPUOpError
from vllm_npu.ops.sim.opaque import NAMESPACE as OPAQUE_SIM
from vllm_npu.ops.sim.task_args import addresses, hold, resolve, same_call


@dataclass
class _Entry:
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    outputs: Any = None
    task: bool = False  # a task group's call: device-tensor arguments held weakly
    out_fn: Callable[..., Any] | None = None  # writes `outputs` in place (out_overload)
    matmul: bool = False  # runs on the device's cores (MATMULS)
    # the prepared kernel launches (graph_op `launcher` / `replay_launch`, OWN_LAUNCH:
    # native.Launch, or a Python callable); None: the replay runs the op
    launch: tuple | None = None
    native: bool = False  # every launch a native.Launch (run in a replay's program)
    refs: tuple = ()  # a task's addresses its launch reads and writes (DeviceRef)
    builder: Callable[[], Any] | None = None  # prepares a non-task entry's launch again

    def prepared(self, launch: native.Launch | tuple | None) -> None:
        """The call's launch (None: the replay runs the op) and, for a task, the addresses
        it uses."""
        self.launch = launch if launch is None or isinstance(launch, tuple) else (launch,)
        self.native = launch is not None and all(isinstance(x, native.Launch)
                                                 for x in self.launch)
        self.refs = () if launch is None or not self.task else tuple(
            addresses(self.args) + addresses(self.kwargs))

    def prepare(self, builder: Callable[[], Any]) -> None:
        """A non-task entry's launch, built now and again whenever its memory moved."""
        self.builder = builder
        self.prepared(builder())

    def run(self) -> None:
        if self.matmul:
            with cores.device_compute_threads():
                self._run()
        else:
            self._run()

    def _run(self) -> None:
        if self.launch is not None:
            for ref in self.refs:
                ref.check(self.fn.__name__)
            for launch in self.launch:
                launch()
            return
        args, kwargs = self.args, self.kwargs
        if self.out_fn is not None:
            self.out_fn(*args, **kwargs, out=self.outputs)
            return
        if self.task:
            name = self.fn.__name__
            args, kwargs = resolve(args, name), resolve(kwargs, name)
        fresh = self.fn(*args, **kwargs)
        if type(self.outputs) is torch.Tensor and isinstance(fresh, torch.Tensor):
            graph_aten.copy_one(self.outputs, fresh)  # most entries: one plain tensor out
        elif self.outputs is not None:
            graph_aten.copy_into(self.outputs, fresh)


@dataclass(eq=False)
class TaskHandle:
    """A group of op-surface calls in a captured graph whose arguments can be updated."""
    graph: "SimGraph"
    entries: list[_Entry] = field(default_factory=list)
    layouts: list[Any] = field(default_factory=list)  # each call's argument shapes
    updates: int = 0


class _State(threading.local):
    capturing: "SimGraph | None" = None
    open_task: TaskHandle | None = None
    updating: TaskHandle | None = None
    pending: list | None = None
    update_stream: Any = None
    stream: Any = None  # the current stream (None: the default stream)


_state = _State()
_REISSUED = object()  # a pending update call's layouts: `relaunch` kept the task's launch
# vLLM's attention, MoE and collective custom ops are opaque containers: never recorded as
# one frozen call; what they run inside is (op-surface calls as tasks, other aten ops as
# entries, e.g. MLA's weight-absorption matmuls around its attention task, the MoE layer's
# routing, the HCCL binding's graph-op collectives).
_OPAQUE_NAMESPACE = "vllm"
_OPAQUE_PREFIXES = ("unified_", "moe_forward", "all_reduce", "all_gather", "reduce_scatter",
                    "mamba_mixer2", "qwen_gdn_attention_core")
_OPAQUE_KERNEL_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _is_opaque(func) -> bool:
    name = getattr(func, "name", lambda: "")()
    ns, _, op = name.partition("::")
    # the simulated ops compiled code calls (opaque.py): their op-surface call is recorded
    return ns == _OPAQUE_NAMESPACE and op.startswith(_OPAQUE_PREFIXES) or ns == OPAQUE_SIM


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: "SimGraph") -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_opaque(func):
            # Run the op's CPU kernel directly with this mode active again, so the ops it
            # runs are seen here (dispatching `func` itself would come back to this mode).
            with self:
                return func.redispatch(_OPAQUE_KERNEL_KEYS, *args, **kwargs)
        out = func(*args, **kwargs)
        if is_static(func, args, kwargs, out):
            self.graph.static.append(out)  # kept alive with the graph, as its pool is
            if func.name() in ALLOCATIONS:
                self.graph.pool.append(out)
        else:
            own = OWN_REPLAY.get(func) if type(out) is torch.Tensor else None
            in_place = own or (out_overload(func) if type(out) is torch.Tensor else None)
            entry = _Entry(func, args, kwargs, out, out_fn=in_place,
                           matmul=own is None and func.name() in MATMULS)
            launcher = OWN_LAUNCH.get(func) if type(out) is torch.Tensor else None
            if launcher is not None:
                entry.prepare(functools.partial(launcher, *args, out=out, **kwargs))
            self.graph.entries.append(entry)
        return out


class SimGraph:
    """A captured forward: `capture_begin` / `capture_end`, then `replay()`."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.static: list[Any] = []  # captured allocations and views: no replay work
        # the captured allocations alone: the graph's own memory (its pool on a device);
        # a captured view may alias memory outside the graph (a weight's `.data`)
        self.pool: list[Any] = []
        self.tasks: list[TaskHandle] = []
        self.replays = 0
        self._recorder: _Recorder | None = None
        self._plan: tuple | None = None  # graph_program.plan's steps, storages, programs

    def capture_begin(self, pool: Any = None) -> None:
        if _state.capturing is not None:
            raise RuntimeError("a simulated graph is already capturing")
        self.entries, self.static, self.pool, self.tasks = [], [], [], []
        self._plan = None
        self._recorder = _Recorder(self)
        self._recorder.__enter__()
        _state.capturing = self

    def capture_end(self, aborted: bool = False) -> None:
        """`aborted`: the capture failed with an error of its own, which must surface."""
        if _state.open_task is not None and not aborted:
            raise RuntimeError("capture ended inside graph_task_group_begin/end")
        _state.open_task = None
        _state.capturing = None
        self._recorder.__exit__(None, None, None)
        self._recorder = None

    def replay(self) -> None:
        if _state.capturing is not None:
            raise RuntimeError("cannot replay while a graph is capturing")
        if self._plan is None:
            self._plan = graph_program.plan(self.entries, self.pool)
        if not graph_program.unmoved(self._plan[1]):
            for entry in self.entries:  # memory moved (sleep mode): launches prepared again
                if entry.builder is not None:
                    entry.prepare(entry.builder)
            self._plan = graph_program.plan(self.entries, self.pool)
        # Recorded aten calls are below __torch_function__: a parameter subclass's
        # override (vLLM's BasevLLMParameter) already ran at capture, not again per replay.
        with torch.inference_mode(), torch._C.DisableTorchFunctionSubclass():
            for step in self._plan[0]:
                step.run()
        self.replays += 1

    def relaunched(self, entry: _Entry) -> None:
        """A task entry's launch replaced by an update: patched into its program (planned
        again where it does not fit)."""
        if self._plan is None:
            return
        program = self._plan[2].get(id(entry))
        if program is None:
            if entry.native:  # launchable now: planned again
                self._plan = None
        elif not program.replace(entry):
            self._plan = None

    def reset(self) -> None:
        self.entries, self.static, self.pool, self.tasks = [], [], [], []
        self._plan = None


def graph_op(fn: Callable[..., Any] | None = None, *, host_args: tuple[str, ...] = (),
             workspace: bool = False,
             replay_launch: Callable[..., Any] | None = None,
             launcher: Callable[..., Any] | None = None,
             relaunch: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Make a simulated op graph-aware: recorded as one entry under capture (a task's
    entry inside a task group), and captured into a task update inside one.

    `host_args` name the op's host-side arguments (sequence-length lists, host int32
    tensors). A device task copies them when it is captured or updated (ACL graph tasks
    hold their launch arguments: torch_npu `graph_task_update_begin/end` exist to replace
    them, and vllm-ascend re-issues its attention with new `actual_seq_lengths_kv` before
    each replay), so a later in-place change of the host buffer is not seen by a replay.
    The simulator copies them at the same points.

    `workspace`: the op takes a `workspace` tensor, which a task needs given (torch_npu
    `npu_fused_infer_attention_score.out` and ATB `_npu_paged_attention` otherwise
    allocate one per call and free it on return, so the task keeps a dangling address;
    vllm-ascend passes `_npu_fused_infer_attention_score_get_max_workspace` /
    `_npu_paged_attention_get_workspace` results in its graph paths).

    `replay_launch(outputs, *args, **kwargs) -> native.Launch | None`: the kernel launch
    of a call recorded outside task groups, prepared at capture on its arguments and
    writing straight into its captured outputs; None where it does not cover the case
    (the replay then runs the op and copies its results in, as for a task without a
    launcher). On the device a replay re-launches the captured kernels on the addresses
    they had at capture, their outputs in the graph's memory pool (torch_npu
    `csrc/core/npu/NPUGraph.cpp`: `capture_begin` allocates from the graph's `MemPool` and
    records through `aclmdlRICaptureBegin`, `replay` executes the recorded model), so the
    outputs are written in place, never fresh tensors.

    `launcher(*args, **kwargs) -> launch | None`: a task call's kernel launches
    (`native.Launch`, a tuple of them, or a Python callable the replay calls), prepared
    when the call is issued (captured, or re-issued in an update): the op's checks, then
    its kernels on that call's addresses and the host data it copied (holding no device tensor), or None where the call needs
    work a fixed launch cannot do (converting device data) and the replay runs the op. A
    device runtime checks an op and fixes its launch arguments when the op is issued; a
    replay only launches (CANN `aclmdlRIExecute` runs the recorded tasks, no host code of
    the op runs again). Before launching, a replay checks that the launch's memory is
    still there (`task_args.DeviceRef.check`; graph_program.py for the other launches).
    Consecutive launches run in one native call (graph_program.py).

    `relaunch(launch, held, call) -> commit`: an update's call that re-issues its task's
    call on the same memory (`task_args.same_call`: only host data changed, the common
    decode step) with the task's launch kept: the op's checks that read the new host
    data, then a `commit()` that task_update_end runs to write that data into the task's
    copy and its launch; the other checks gave the same answer when the call was issued."""
    if fn is None:
        return functools.partial(graph_op, host_args=host_args, workspace=workspace,
                                 replay_launch=replay_launch, launcher=launcher,
                                 relaunch=relaunch)
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    kinds = inspect.Parameter
    extra = next((p.name for p in params if p.kind is kinds.VAR_KEYWORD), None)
    positional = None if any(p.kind is kinds.VAR_POSITIONAL for p in params) else [
        p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    keywords = frozenset(p.name for p in params
                         if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY))

    def by_name(args: tuple, kwargs: dict) -> dict | None:
        """The call's arguments by parameter name, as `signature.bind_partial` gives them
        with the **kwargs parameter flattened, without its ~5 us per call; None where the
        call is not that plain case (bind_partial then binds it, or raises its TypeError)."""
        if positional is None or len(args) > len(positional):
            return None
        named = dict(zip(positional, args))
        for key, value in kwargs.items():
            if key in named or (key not in keywords and extra is None):
                return None
            named[key] = value
        return named

    def held(args: tuple, kwargs: dict, task: bool) -> tuple[tuple, dict, dict | None]:
        """The call as its entry keeps it (`hold`: host arguments copied; with `task`,
        device tensors by address) and its layouts by argument name (None: not a task)."""
        if not host_args and not task:
            return args, kwargs, None
        named, bound = by_name(args, kwargs), None
        if named is None:
            bound = signature.bind_partial(*args, **kwargs)
            named = dict(bound.arguments)
            named.update(named.pop(extra, {}) if extra else {})
        if task and workspace and named.get("workspace") is None:
            raise NPUOpError(f"{fn.__name__} in a graph task needs a workspace (the op would "
                             "allocate one per call and free it on return, leaving the task a "
                             "dangling address): pass one from its get-workspace function "
                             "and keep it until the graph is replayed")
        kept, layouts = {}, {}
        for name, value in named.items():
            kept[name], layouts[name] = hold(value, name in host_args, task, fn.__name__, name)
        if bound is None:
            return (tuple(kept[name] for name in positional[:len(args)]),
                    {key: kept[key] for key in kwargs}, layouts)
        for name, value in list(bound.arguments.items()):
            bound.arguments[name] = ({k: kept[k] for k in value} if name == extra
                                     else kept[name])
        return bound.args, bound.kwargs, layouts

    def reissued(args: tuple, kwargs: dict) -> Callable[[], None] | None:
        """`relaunch`'s commit for an update's call that re-issues the task's current one
        on the same memory; None: the call is held and launched anew."""
        entries, i = _state.updating.entries, len(_state.pending)
        entry = entries[i] if i < len(entries) else None
        if entry is None or entry.fn is not fn or entry.launch is None:
            return None
        call, kept = by_name(args, kwargs), by_name(entry.args, entry.kwargs)
        if call is None or kept is None or not same_call(kept, call, host_args):
            return None
        return relaunch(entry.launch, kept, call)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with update_stream.exempt():  # the op itself is the task's (re-)launch
            return call(*args, **kwargs)

    def call(*args, **kwargs):
        if _state.pending is not None and current_stream() is _state.update_stream:
            commit = reissued(args, kwargs) if relaunch is not None else None
            if commit is not None:
                _state.pending.append((fn, None, None, _REISSUED, commit))
                return None
            # becomes the task's call once graph_task_update_end has checked it
            kept_args, kept_kwargs, layouts = held(args, kwargs, True)
            launch = launcher(*args, **kwargs) if launcher is not None else None
            _state.pending.append((fn, kept_args, kept_kwargs, layouts, launch))
            return None
        # (inside an update window but on another stream, a device runs the op now, with
        # these arguments, and the update receives nothing: modelled the same way)
        graph = _state.capturing
        if graph is None:
            return fn(*args, **kwargs)
        task = _state.open_task
        with _disable_current_modes():  # the op is one task: its internals (and the
            # copies of its host arguments) are not recorded
            kept_args, kept_kwargs, layouts = held(args, kwargs, task is not None)
            out = fn(*args, **kwargs)
            entry = _Entry(fn, kept_args, kept_kwargs, out, task is not None)
            if task is not None and launcher is not None:
                entry.prepared(launcher(*args, **kwargs))
            elif task is None and replay_launch is not None:
                entry.prepare(functools.partial(replay_launch, out, *kept_args,
                                                **kept_kwargs))
        if task is not None:
            given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                     if isinstance(t, torch.Tensor)}
            if any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given
                   for t in tree_leaves(out)):
                raise NPUOpError(
                    f"{fn.__name__} allocates its outputs: inside a graph task group use "
                    "its out variant (a task update re-issues the op, and a non-out variant "
                    "would write to fresh buffers the graph never reads)")
            task.entries.append(entry)
            task.layouts.append(layouts)
        graph.entries.append(entry)
        return out

    return wrapper


@contextlib.contextmanager
def host_work():
    """Host-side computation inside a capture or on the graph-update stream (sizing a
    workspace from host sequence lengths): on a device, ops on CPU tensors run once on the
    host, never as graph tasks or stream work; here every tensor is a CPU tensor, so the
    recorder and the update stream's rule (update_stream.py) are told. Allocations made
    inside belong to the caller, who keeps them alive (the attention tasks' workspaces are
    held by GRAPH_PARAMS)."""
    with update_stream.exempt():
        if _state.capturing is None:
            yield
            return
        with _disable_current_modes():
            yield


def is_capturing() -> bool:
    return _state.capturing is not None


def graph_task_group_begin(stream: Any = None) -> None:
    if _state.capturing is None:
        raise RuntimeError("graph_task_group_begin outside graph capture")
    if _state.open_task is not None:
        raise RuntimeError("graph task groups do not nest")
    _state.open_task = TaskHandle(_state.capturing)


def graph_task_group_end(stream: Any = None) -> TaskHandle:
    handle = _state.open_task
    if handle is None:
        raise RuntimeError("graph_task_group_end without graph_task_group_begin")
    _state.open_task = None
    handle.graph.tasks.append(handle)
    return handle


def graph_task_update_begin(stream: Any, handle: TaskHandle) -> None:
    """Ops issued on `stream` (torch_npu: inside `torch.npu.stream(stream)`) until
    graph_task_update_end replace the handle's captured calls; `stream` None means the
    current one. Source: torch_npu `graph_task_update_begin(stream, handle)` forwards to
    CANN `aclmdlRICaptureTaskUpdateBegin(stream, handle)`, which collects the tasks
    launched on that stream until `aclmdlRICaptureTaskUpdateEnd(stream)` and fails when
    their number differs from the task group's; vllm-ascend therefore issues its updates
    under `torch.npu.stream(update_stream)` (attention_v1.py `update_attn_params`)."""
    if _state.pending is not None:
        raise RuntimeError("graph task updates do not nest")
    _state.updating, _state.pending = handle, []
    _state.update_stream = current_stream() if stream is None else stream


def graph_task_update_end(stream: Any = None) -> None:
    handle, calls = _state.updating, _state.pending
    _state.updating = _state.pending = _state.update_stream = None
    if handle is None:
        raise RuntimeError("graph_task_update_end without graph_task_update_begin")
    if [fn for fn, *_ in calls] != [e.fn for e in handle.entries]:
        raise NPUOpError("graph task update must re-issue the captured ops in order on the "
                         "update stream (torch.npu.stream(update_stream)): captured "
                         f"{[e.fn.__name__ for e in handle.entries]}, got "
                         f"{[fn.__name__ for fn, *_ in calls]} on that stream")
    for (fn, _, _, layouts, _), captured in zip(calls, handle.layouts):
        if layouts is _REISSUED or layouts == captured:
            continue
        # An updated task keeps its captured launch configuration (tiling, block dim):
        # vllm-ascend pads every updated argument to the captured batch (seq lens padded
        # with zeros to the graph size, mla_v1.py) instead of slicing the buffers.
        for name in sorted(set(layouts) | set(captured)):
            layout = layouts.get(name)
            if layout != captured.get(name):
                raise NPUOpError(f"graph task update of {fn.__name__}: {name} is {layout}, "
                                 f"captured {captured.get(name)}; pad the update's arguments "
                                 "to the captured batch")
    with update_stream.exempt():  # the runtime's own bookkeeping, not stream work
        for entry, (_, args, kwargs, layouts, launch) in zip(handle.entries, calls):
            if layouts is _REISSUED:
                launch()  # the commit: new host data into the task's kept call and launch
                continue
            entry.args, entry.kwargs = args, kwargs
            entry.prepared(launch)
            handle.graph.relaunched(entry)
    handle.updates += 1


class SimStream:
    """Streams of the simulated NPU: work completes when issued, so they only name order
    and which update window an op belongs to."""

    def wait_event(self, event: "ExternalEvent") -> None:
        event.wait(self)


_DEFAULT_STREAM = SimStream()


def current_stream() -> SimStream:
    return _state.stream or _DEFAULT_STREAM


@contextlib.contextmanager
def use_stream(stream: SimStream):
    """`torch.npu.stream(stream)` of the simulated NPU; on another stream than the default
    one, only task re-launches and host work run (update_stream.py)."""
    previous, _state.stream = _state.stream, stream
    try:
        if stream is _DEFAULT_STREAM:
            yield stream
        else:
            with update_stream.UpdateStreamMode():
                yield stream
    finally:
        _state.stream = previous


class ExternalEvent:
    """torch.npu.ExternalEvent: orders a graph's replay after its task updates. Its wait and
    reset are captured into the graph as event nodes (torch_npu streams.py: "Event is
    captured in the graph as an external event node ... Before reusing ExternalEvent, you
    need to call reset()"); an update records it on the update stream (torch_npu's
    test_aclgraph_update.py, vllm-ascend's attention backends). A replay whose captured
    wait finds no record since the last reset would wait forever on a device: refused."""

    def __init__(self) -> None:
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.recorded = True

    def wait(self, stream: Any = None) -> None:
        if _state.capturing is not None:
            _state.capturing.entries.append(_Entry(self._replayed_wait, (), {}))
        else:
            self._replayed_wait()

    def reset(self, stream: Any = None) -> None:
        if _state.capturing is not None:
            _state.capturing.entries.append(_Entry(self._replayed_reset, (), {}))
        else:
            self.recorded = False

    def _replayed_wait(self) -> None:
        if not self.recorded:
            raise NPUOpError("a replay waits on an ExternalEvent no task update recorded "
                             "since its reset: the device would wait forever")

    def _replayed_reset(self) -> None:
        self.recorded = False
