"""Packaging as a user meets it: the wheel and the sdist built from this checkout, each
installed into a fresh venv that shares `make install`'s packages but not this checkout,
run a TP=2 generation on the simulated NPU from outside the repository (the HCCL
simulator must come from the installed package). Also: the startup version line and its
compatibility table, and the Ascend Dockerfile (parsed; it cannot be built here)."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.reference import hf_greedy, random_prompt
from vllm_npu import versions

ROOT = Path(__file__).resolve().parents[1]
VENV_SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" \
    / "site-packages"

GENERATE = r"""
import json, os, sys
from vllm import LLM, SamplingParams
import vllm_npu
from vllm_npu.distributed.hccl_library import SIMULATOR_PATH
llm = LLM(sys.argv[1], dtype="float32", tensor_parallel_size=2, max_model_len=256,
          distributed_executor_backend="mp", num_gpu_blocks_override=16, seed=0)
out = llm.generate([{"prompt_token_ids": json.loads(sys.argv[2])}],
                   SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                   use_tqdm=False)
print("RESULT", json.dumps({"tokens": list(out[0].outputs[0].token_ids),
                            "package": vllm_npu.__file__, "library": str(SIMULATOR_PATH)}))
"""


def _run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(NPU_PLUGIN_SIMULATE="1", VLLM_ENABLE_V1_MULTIPROCESSING="1")
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{shlex.join(cmd)}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def _fresh_venv(path: Path) -> Path:
    """A venv holding every package of this one (symlinked) except vllm_npu; with make
    install's torchvision hook (a .pth that imports the installed vllm_npu's shim: vLLM's
    import reaches torchvision through transformers' image utilities)."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)], cwd=path.parent)
    site = path / "lib" / VENV_SITE.parent.name / "site-packages"
    for entry in VENV_SITE.iterdir():
        if ("vllm_npu" in entry.name and entry.name != "vllm_npu_torchvision.pth") \
                or (site / entry.name).exists():
            continue
        (site / entry.name).symlink_to(entry)
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(out), str(ROOT)], cwd=out)
    _run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
          "print(build_meta.build_sdist(sys.argv[1]))", str(out)], cwd=ROOT)
    (wheel,) = out.glob("vllm_npu-*.whl")
    (sdist,) = out.glob("vllm_npu-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_is_a_platform_wheel_holding_the_simulator(dists):
    wheel = dists["wheel"]
    assert not wheel.name.endswith("-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert "vllm_npu/distributed/libhccl_sim.so" in names
    assert "vllm_npu/ops/sim/libnpu_sim_kernels.so" in names
    import tarfile

    members = tarfile.open(dists["sdist"]).getnames()
    for src in ("csrc/hccl_sim.c", "csrc/hccl_sim.h", "csrc/hccl_sim_hosts.c", "csrc/sim_kernels.c",
                "csrc/sim_prefill.c", "csrc/sim_decode.c", "csrc/sim_paged.h",
                "csrc/sim_vec.h", "csrc/sim_math.h", "setup.py"):
        assert any(m.endswith(src) for m in members), src


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_package_runs_tp2_outside_the_checkout(dists, kind, tmp_path, tiny_models):
    python = _fresh_venv(tmp_path / "venv")
    _run([str(python), "-m", "pip", "--version"], cwd=tmp_path)  # pip from the shared packages
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
          "--no-index", str(dists[kind])], cwd=tmp_path)
    prompt = random_prompt(900, 12, 512)
    done = _run([str(python), "-c", GENERATE, tiny_models["llama"], json.dumps(prompt)],
                cwd=tmp_path, timeout=600)
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    venv = str(tmp_path / "venv")
    assert result["package"].startswith(venv) and result["library"].startswith(venv)
    assert Path(result["library"]).is_file()
    assert result["tokens"] == hf_greedy(tiny_models["llama"], prompt, 8)
    assert "vllm_npu 0.1.0 on the simulated NPU: vLLM 0.33.0" in done.stdout + done.stderr


# ------------------------------------------------------------------ versions

def test_readme_compatibility_table_is_the_supported_list():
    text = (ROOT / "README.md").read_text()
    head = "| device | vLLM | torch | torch_npu | CANN |"
    rows = text[text.index(head):].split("\n\n")[0].splitlines()[2:]
    table = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert table == [[c.device, c.vllm, c.torch, c.torch_npu or "-", c.cann]
                     for c in versions.SUPPORTED]


def test_version_line_and_untested_combinations():
    v = versions.Versions("0.1.0", "0.33.0", "2.13.0+cpu", None, None)
    assert v.line("simulated NPU") == ("vllm_npu 0.1.0 on the simulated NPU: vLLM 0.33.0, "
                                       "torch 2.13.0+cpu, torch_npu -, CANN -")
    assert versions.problems(v, "simulated NPU") == []
    assert versions.problems(v, "Ascend NPU") == ["torch 2.13.0+cpu (supported: 2.14.x)",
                                                  "torch_npu None (supported: 2.14.x)"]
    device = versions.Versions("0.1.0", "0.33.0", "2.14.1", "2.14.0.post2", "8.3.RC1")
    assert versions.problems(device, "Ascend NPU") == []
    old = versions.Versions("0.1.0", "0.32.1", "2.13.0", None, None)
    assert versions.problems(old, "simulated NPU") == ["vLLM 0.32.1 (supported: 0.33.0)"]
    here = versions.installed()  # this CI machine runs a supported combination
    assert here.vllm.split("+")[0] == "0.33.0" and versions.problems(here, "simulated NPU") == []


def test_cann_version_is_read_from_the_toolkit_record(tmp_path):
    import platform

    record = tmp_path / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
    record.parent.mkdir()
    record.write_text("package_name=Ascend-cann-toolkit\nversion=8.2.RC1\n")
    assert versions.cann_version([str(tmp_path / "none"), str(tmp_path)]) == "8.2.RC1"
    assert versions.cann_version([str(tmp_path / "none")]) is None


# ------------------------------------------------------------------ Dockerfile

DOCKER_INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "ENTRYPOINT",
                       "CMD", "LABEL", "EXPOSE", "USER", "SHELL", "VOLUME"}


def _instructions(text: str) -> list[tuple[str, str]]:
    """(instruction, arguments) with line continuations joined and comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            word, _, rest = current.strip().partition(" ")
            out.append((word, rest.strip()))
            current = ""
    assert not current, f"dangling continuation: {current!r}"
    return out


def test_ascend_dockerfile_parses_and_copies_what_exists():
    steps = _instructions((ROOT / "docker" / "Dockerfile.ascend").read_text())
    assert all(word in DOCKER_INSTRUCTIONS for word, _ in steps), steps
    words = [w for w, _ in steps]
    assert set(words[:words.index("FROM")]) == {"ARG"}  # only ARGs before the first FROM
    run = " ".join(r for w, r in steps if w == "RUN")
    for pinned in ("torch==${TORCH_VERSION}", "torch_npu==${TORCH_NPU_VERSION}",
                   "vllm==${VLLM_VERSION}", "VLLM_TARGET_DEVICE=empty"):
        assert pinned in run, pinned
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", (ROOT / "docker" / "Dockerfile.ascend")
                           .read_text(), re.M))
    assert (args["TORCH_VERSION"][:4], args["TORCH_NPU_VERSION"][:4], args["VLLM_VERSION"]) \
        == (versions.SUPPORTED[1].torch, versions.SUPPORTED[1].torch_npu,
            versions.SUPPORTED[1].vllm)
    for word, rest in steps:
        if word == "COPY":
            *sources, _ = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY source {src} missing"
        if word in ("ENTRYPOINT", "CMD"):
            assert isinstance(json.loads(rest), list)


def test_without_a_c_compiler_the_build_says_so_and_still_succeeds(dists, tmp_path):
    """`CC=false`: compiling the simulator fails; the wheel (built from the sdist, in a
    fresh directory) is still built, since one simulated NPU needs no library, and the
    build output says what is missing and what to do."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(dists["sdist"])], cwd=tmp_path, capture_output=True,
        text=True,
        env=dict(env, CC="false"))
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    for library in ("libhccl_sim.so", "libnpu_sim_kernels.so"):
        assert f"vllm_npu: {library} was NOT built" in out
    assert "install a C compiler (gcc) and reinstall vllm_npu" in out
    (wheel,) = tmp_path.glob("vllm_npu-*.whl")
    assert not any(n.endswith(".so") for n in zipfile.ZipFile(wheel).namelist())
