"""`--kv-transfer-config` on the NPU: which connector runs, and the Mooncake transport.

Checked once at startup (the platform's `check_and_update_config`), so a wrong protocol or a
missing transfer engine is an error naming the fix, not a failure inside the first request.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.logger import init_logger

from vllm_npu.device import select_backend

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

NPU_MOONCAKE_MODULE = "vllm_npu.distributed.kv_transfer.mooncake"
# The transport per device: TCP between host buffers for the simulated NPU (whose KV cache
# is host memory); Mooncake's Ascend transport (HCCS / RoCE between NPU memories, the
# protocol vllm-ascend initialises its engine with) on a device.
PROTOCOLS = {True: ("tcp",), False: ("ascend",)}
# A pulling decode worker probes its prefill worker this often, and gives the pull up after
# this many failed probes in a row (liveness.py).
PROBE_KEYS = (("peer_probe_interval_s", float, 2.0), ("peer_probe_misses", int, 3))
PACKAGES = {True: "mooncake-transfer-engine-non-cuda", False: "mooncake-transfer-engine-npu"}


def adopt_kv_transfer_config(vllm_config: VllmConfig) -> None:
    """Route vLLM's MooncakeConnector to the NPU subclass; check its transport."""
    kv = vllm_config.kv_transfer_config
    if kv is None or kv.kv_connector != "MooncakeConnector" or kv.kv_connector_module_path:
        return
    kv.kv_connector_module_path = NPU_MOONCAKE_MODULE
    extra = kv.kv_connector_extra_config
    simulated = select_backend().simulated
    valid = PROTOCOLS[simulated]
    protocol = extra.setdefault("mooncake_protocol", valid[0])
    if protocol not in valid:
        where = "the simulated NPU (its KV cache is host memory)" if simulated else "an NPU"
        raise ValueError(f"kv_connector_extra_config.mooncake_protocol {protocol!r} does not "
                         f"run on {where}; valid: {list(valid)}")
    for key, kind, default in PROBE_KEYS:
        value = extra.setdefault(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0 \
                or (kind is int and value != int(value)):
            raise ValueError(f"kv_connector_extra_config.{key} = {value!r}: expected a "
                             f"positive {kind.__name__} (default {default})")
    check_transfer_engine(simulated)
    logger.info("vllm_npu: MooncakeConnector (%s) runs as %s.MooncakeConnector over %s",
                kv.kv_role, NPU_MOONCAKE_MODULE, protocol)


# Connectors whose workers cannot hold NPU memory. vLLM's NIXL worker registers memory of
# the devices in its _NIXL_SUPPORTED_DEVICE (nixl/utils.py: cuda, xpu, tpu, cpu, plus what
# a platform's get_nixl_supported_devices adds; the NPU adds none): on a device it stops on
# "npu is not supported", on the simulated NPU (device type "cpu") in the CPU platform's
# NUMA discovery (a TypeError), without the nixl package on "NIXL is not available".
# Refused when the worker sets up its KV cache, before the connector's worker exists; the
# scheduler side of these connectors is device-free and stays usable.
WORKERLESS_CONNECTORS = {"NixlConnector": "NIXL registers no NPU memory"}


def check_worker_connector(vllm_config: VllmConfig) -> None:
    """A ValueError naming the fix when the KV connector has no NPU worker side."""
    kv = vllm_config.kv_transfer_config
    name = kv.kv_connector if kv is not None else None
    if name in WORKERLESS_CONNECTORS and not kv.kv_connector_module_path:
        raise ValueError(
            f"kv_connector {name!r} does not run on the NPU: {WORKERLESS_CONNECTORS[name]} "
            "(vLLM's nixl/utils.py _NIXL_SUPPORTED_DEVICE); for disaggregated prefill on "
            "the NPU use MooncakeConnector")


def check_transfer_engine(simulated: bool) -> None:
    """The Mooncake transfer engine imports, or a ValueError says what to install."""
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as e:
        hint = ""
        if "libibverbs" in str(e):
            # The pip wheels link libibverbs even for TCP (Debian/Ubuntu: libibverbs1).
            hint = "; its engine needs the system library libibverbs.so.1 " \
                   "(apt-get install libibverbs1)"
        raise ValueError(f"MooncakeConnector needs the Mooncake transfer engine: pip install "
                         f"{PACKAGES[simulated]}{hint} ({e})") from e
