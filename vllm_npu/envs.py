"""The plugin's environment variables, typed, in one place.

None starts with ``VLLM_``: vLLM warns about unknown ``VLLM_*`` variables.
Read them through the functions here, never through ``os.environ`` directly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off")


def _positive_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"{name}={raw!r} must be > 0")
    return value


def _non_negative_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not value >= 0:
        raise ValueError(f"{name}={raw!r} must be >= 0")
    return value


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be > 0")
    return value


def _text(name: str, raw: str) -> str:
    return raw.strip()


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    name: str
    default: T
    parse: Callable[[str, str], T]
    doc: str

    def get(self) -> T:
        raw = os.environ.get(self.name)
        return self.default if raw is None else self.parse(self.name, raw)


NPU_PLUGIN_DISABLE = EnvVar("NPU_PLUGIN_DISABLE", False, _bool,
                            "1: the plugin stays inactive (vLLM picks another platform).")
NPU_PLUGIN_SIMULATE = EnvVar("NPU_PLUGIN_SIMULATE", False, _bool,
                             "1: use the simulated NPU even where torch_npu finds a device.")
NPU_SIM_MEMORY_GB = EnvVar("NPU_SIM_MEMORY_GB", 4.0, _positive_float,
                           "Memory capacity of each simulated NPU, in GiB.")
NPU_SIM_CORES = EnvVar("NPU_SIM_CORES", 0, _positive_int,
                       "CPU cores each simulated NPU computes with (native kernel threads, "
                       "torch threads of eager forwards); unset: this process's CPUs / "
                       "the ranks on this host.")
NPU_SIM_DEVICE_COUNT = EnvVar("NPU_SIM_DEVICE_COUNT", 8, _positive_int,
                              "Number of simulated NPUs on this host.")
NPU_KV_IDLE_POLL_MS = EnvVar(
    "NPU_KV_IDLE_POLL_MS", 5.0, _non_negative_float,
    "With a KV connector: ms a worker pauses after an engine step that ran no tokens and "
    "found no transfer finished (the engine polls transfers in a loop); 0: no pause.")

# HCCL: the two HCCL_SIM_* are read by the simulator library itself (getenv); declared here
# so that every variable the plugin honours is listed in one place.
HCCL_LIBRARY_PATH = EnvVar("HCCL_LIBRARY_PATH", "", _text,
                           "Path of the libhccl.so to load, overriding the search.")
HCCL_SIM_TIMEOUT_S = EnvVar("HCCL_SIM_TIMEOUT_S", 60.0, _positive_float,
                            "Simulator: seconds a rank waits for its peers before "
                            "HCCL_E_TIMEOUT (read at communicator creation).")
HCCL_SIM_BUFFER_MB = EnvVar("HCCL_SIM_BUFFER_MB", 16.0, _positive_float,
                            "Simulator: MiB of shared staging memory per communicator.")


@dataclass(frozen=True)
class TransferFault:
    layer_id: int
    rank: int  # EP rank
    kind: str  # "error": the received weights fail; "timeout": the transfer overruns


def _transfer_faults(name: str, raw: str) -> tuple[TransferFault, ...]:
    faults = []
    for item in filter(None, (x.strip() for x in raw.split(","))):
        parts = item.split(":")
        kind = parts[2] if len(parts) == 3 else "error"
        try:
            layer, rank = int(parts[0]), int(parts[1])
        except (ValueError, IndexError):
            layer = rank = -1
        if len(parts) not in (2, 3) or min(layer, rank) < 0 or kind not in ("error", "timeout"):
            raise ValueError(f"{name}={raw!r}: expected comma-separated "
                             "'<layer_id>:<ep_rank>[:error|timeout]', e.g. '1:0,3:1:timeout'")
        faults.append(TransferFault(layer, rank, kind))
    return tuple(faults)


NPU_EPLB_FAIL_TRANSFER = EnvVar(
    "NPU_EPLB_FAIL_TRANSFER", (), _transfer_faults,
    "Fault injection: comma-separated '<layer_id>:<ep_rank>[:error|timeout]'; each fails "
    "that rank's first EPLB weight transfer of that MoE layer once (tests the rollback).")

ALL = (NPU_PLUGIN_DISABLE, NPU_PLUGIN_SIMULATE, NPU_SIM_MEMORY_GB, NPU_SIM_DEVICE_COUNT,
       NPU_KV_IDLE_POLL_MS, HCCL_LIBRARY_PATH, HCCL_SIM_TIMEOUT_S, HCCL_SIM_BUFFER_MB, NPU_EPLB_FAIL_TRANSFER)
