"""The package's import structure, read from the code: no import circle, every import goes
down the layer order of docs/README.md's map, and the "never touches" rules of the design
hold. Every import statement counts, also those inside functions: a lazy import still ties
the two modules together."""
from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vllm_npu"

# Lowest first; a unit imports only units of a lower level (and itself).
LAYERS = [
    ("envs", "versions", "fork_safety", "torchvision_shim"),  # stdlib (and torch) only
    ("device",),                          # real NPU or simulated
    ("ops",),                             # the op surface and the simulator behind it
    ("compilation", "kv_layout", "eplb.policy", "testing", "disagg"),
    ("config", "moe", "lora", "spec_decode"),
    ("attention", "distributed", "layers"),
    ("quantization",),
    ("eplb.runtime",),
    ("worker",),
    ("kernel_overrides", "patch"),
    ("registration",),
    ("platform",),
    ("vllm_npu",),                        # the entry points (vllm_npu/__init__.py)
]
LEVEL = {unit: level for level, units in enumerate(LAYERS) for unit in units}

# shared/design.md's "never touches" column, as units a unit must not import.
NEVER = {
    "platform": ({"worker"}, "the platform asks the device, never the worker"),
    "distributed": ({"attention", "worker"}, "communication never reaches into attention"),
    "eplb.runtime": ({"attention", "worker"}, "EPLB never touches attention or scheduling"),
    "eplb.policy": (set(LEVEL) - {"eplb.policy"}, "policies are pure numpy/numba/scipy"),
    "attention": ({"layers", "moe", "worker"}, "attention never touches model files"),
    "compilation": ({"attention", "layers", "moe", "quantization"},
                    "graph capture never touches model math"),
    "ops": (set(LEVEL) - {"ops", "device", "envs", "versions"}, "the op surface is the leaf"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def unit(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "vllm_npu"
    if parts[0] == "eplb":  # two units: the package's own __init__ re-exports the policies
        return "eplb.runtime" if parts[1:2] == ["runtime"] else "eplb.policy"
    return parts[0]


def imports(module: str) -> set[str]:
    """The vllm_npu modules `module` imports (statements anywhere in it)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports pkg.mod; `from mod import name` imports mod
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_is_placed_in_a_layer():
    assert sorted({unit(m) for m in MODULES} - set(LEVEL)) == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_circle_between_modules():
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH))


def test_no_import_circle_between_folders():
    folders = defaultdict(set)
    for a, targets in GRAPH.items():
        folders[unit(a)] |= {unit(b) for b in targets} - {unit(a)}
    assert _cycle(folders) is None, " -> ".join(_cycle(folders))


def _edges():
    for a, targets in sorted(GRAPH.items()):
        for b in sorted(targets):
            if unit(a) != unit(b):
                yield a, b


def test_imports_go_down_the_layers():
    upward = [f"{a} -> {b}" for a, b in _edges() if LEVEL[unit(b)] >= LEVEL[unit(a)]]
    assert upward == []


@pytest.mark.parametrize("source", sorted(NEVER))
def test_design_rules(source):
    forbidden, why = NEVER[source]
    broken = [f"{a} -> {b}" for a, b in _edges() if unit(a) == source and unit(b) in forbidden]
    assert broken == [], why


def test_the_package_never_imports_tests_or_benchmarks():
    broken = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            broken += [f"{module} -> {n}" for n in names
                       if n.split(".")[0] in ("tests", "benchmarks")]
    assert broken == []


def test_the_checker_sees_a_circle_and_an_upward_import():
    """The reader itself: a two-module circle and a lazy upward import are found."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "vllm_npu.compilation.graph_backend" in GRAPH["vllm_npu.layers.fused_moe"]
    assert unit("vllm_npu.eplb.runtime.updator") == "eplb.runtime"
    assert unit("vllm_npu.eplb") == unit("vllm_npu.eplb.policy.flashlb") == "eplb.policy"


def test_policies_import_without_torch_or_vllm():
    code = ("import sys, numpy as np\n"
            "from vllm_npu.eplb.policy import available_policies, get_policy\n"
            "for name in available_policies():\n"
            "    get_policy(name).rebalance(np.arange(16.0).reshape(2, 8), 4, 3)\n"
            "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
