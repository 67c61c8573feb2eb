"""The package's native build step: two plain shared libraries loaded with ctypes.

- `csrc/hccl_sim.c` -> `vllm_npu/distributed/libhccl_sim.so`, the CPU HCCL simulator
  (`vllm_npu/distributed/hccl_library.py` loads it as it would CANN's libhccl.so);
- `csrc/sim_kernels.c` + `csrc/sim_rows.c` + ... -> `vllm_npu/ops/sim/libnpu_sim_kernels.so`,
  the simulated NPU's native kernels (paged decode attention, `vllm_npu/ops/sim/paged_decode.py`;
  RMSNorm, rotary and the KV cache scatter, `vllm_npu/ops/sim/native.py`) and the program
  runner that replays a graph's prepared launches in one call (`csrc/sim_program.c`).

Neither is a Python extension module (no `PyInit_` symbol, their own file names).
setuptools' build_ext compiles them for wheels, sdists built into wheels and editable
installs alike (`make install` runs `pip install -e .`), so the wheel is a platform wheel.
Without a C compiler the install still succeeds and says what is missing: the simulated
NPU then runs decode attention through its dense PyTorch path, and tensor/pipeline
parallelism on the simulated NPU is refused. Everything else is pyproject.toml.
"""
from __future__ import annotations

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# extension name -> (library file, what is lost without it)
LIBRARIES = {
    "vllm_npu.distributed.libhccl_sim": (
        "libhccl_sim.so", "tensor/pipeline/data parallelism on the simulated NPU needs it"),
    "vllm_npu.ops.sim.libnpu_sim_kernels": (
        "libnpu_sim_kernels.so", "the simulated NPU's decode attention, norms, rotary and "
        "cache writes fall back to their slower PyTorch paths"),
}
COMMON = ["-std=gnu11", "-Wall", "-Wextra", "-pthread", "-fvisibility=hidden"]


class BuildPlainLibraries(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        # asked with the dotted name (outputs, copies) and with its last part (link target)
        for name, (library, _) in LIBRARIES.items():
            if fullname == name:
                return os.path.join(*name.split(".")[:-1], library)
            if fullname == name.rpartition(".")[2]:
                return library
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return [] if ext.name in LIBRARIES else super().get_export_symbols(ext)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # no compiler, or a compiler that cannot build it
            if ext.name not in LIBRARIES:
                raise
            library, loss = LIBRARIES[ext.name]
            self.warn(f"vllm_npu: {library} was NOT built ({type(e).__name__}: {e}). The "
                      f"plugin works without it, but {loss}: install a C compiler (gcc) "
                      "and reinstall vllm_npu.")


setup(
    ext_modules=[
        Extension("vllm_npu.distributed.libhccl_sim",
                  sources=["csrc/hccl_sim.c", "csrc/hccl_sim_hosts.c"],
                  depends=["csrc/hccl_sim.h", "csrc/hccl_sim_hosts.h"],
                  extra_compile_args=["-O2", *COMMON],
                  extra_link_args=["-pthread"], libraries=["rt"]),
        # -fopenmp-simd: the `omp simd` reductions only (no OpenMP runtime); no
        # -ffast-math, which would set flush-to-zero for the whole process
        Extension("vllm_npu.ops.sim.libnpu_sim_kernels",
                  sources=["csrc/sim_kernels.c", "csrc/sim_prefill.c", "csrc/sim_decode.c",
                           "csrc/sim_rows.c", "csrc/sim_program.c", "csrc/sim_gemm.c",
                           "csrc/sim_index.c"],
                  depends=["csrc/sim_math.h", "csrc/sim_paged.h", "csrc/sim_vec.h"],
                  extra_compile_args=["-O3", *COMMON, "-fopenmp-simd", "-fno-math-errno",
                                      "-fno-trapping-math", "-Wno-psabi"],
                  extra_link_args=["-pthread"], libraries=["m", "dl"]),
    ],
    cmdclass={"build_ext": BuildPlainLibraries},
)
