"""The package's one native build step: the CPU HCCL simulator.

`csrc/hccl_sim.c` -> `vllm_npu/distributed/libhccl_sim.so`, a plain shared library that
`vllm_npu/distributed/hccl_library.py` loads with ctypes (not a Python extension module:
no `PyInit_` symbol, and its own file name). setuptools' build_ext compiles it for wheels,
sdists built into wheels and editable installs alike (`make install` runs `pip install
-e .`), so the wheel is a platform wheel. Without a C compiler the install still succeeds
and says what is missing: the single-device simulated NPU does not need the library,
tensor/pipeline parallelism on the simulated NPU does. Everything else is pyproject.toml.
"""
from __future__ import annotations

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SIMULATOR = "vllm_npu.distributed.libhccl_sim"
LIBRARY = "libhccl_sim.so"


class BuildHcclSimulator(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        # asked with the dotted name (outputs, copies) and with its last part (link target)
        if fullname == SIMULATOR:
            return os.path.join(*SIMULATOR.split(".")[:-1], LIBRARY)
        if fullname == SIMULATOR.rpartition(".")[2]:
            return LIBRARY
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return [] if ext.name == SIMULATOR else super().get_export_symbols(ext)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # no compiler, or a compiler that cannot build it
            if ext.name != SIMULATOR:
                raise
            self.warn(
                "vllm_npu: the CPU HCCL simulator (libhccl_sim.so) was NOT built "
                f"({type(e).__name__}: {e}). The single-device simulated NPU works without "
                "it; tensor/pipeline/data parallelism on the simulated NPU needs it: "
                "install a C compiler (gcc) and reinstall vllm_npu.")


setup(
    ext_modules=[Extension(
        SIMULATOR, sources=["csrc/hccl_sim.c"], depends=["csrc/hccl_sim.h"],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-pthread",
                            "-fvisibility=hidden"],
        extra_link_args=["-pthread"], libraries=["rt"])],
    cmdclass={"build_ext": BuildHcclSimulator},
)
