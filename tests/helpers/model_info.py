"""vLLM's model-info cache, filled once at the start of the suite.

Before it builds an engine, vLLM inspects the model class of the checkpoint's architecture
(`ModelRegistry._try_inspect_model_cls`). On a miss in its cache ($VLLM_CACHE_ROOT/
modelinfos, one file per class) it does so in a fresh interpreter that imports vLLM and
torch: ~12 s of CPU per architecture on this machine. A machine that ran the suite before
has them cached; a fresh CI machine paid each of the suite's 31 architectures (measured
2026-12-07) on its critical path, the test waiting. Here one background process, started
when collection ends (tests/conftest.py), imports vLLM once and fills the cache for
:data:`ARCHITECTURES` (13 s for 30) through vLLM's own inspection and cache writer, with
the per-class interpreter replaced by a call in that process (its reason, not initialising
CUDA in the caller, does not arise in a process that only inspects). The engines then find
every entry cached, as on a warm machine. An architecture missing from the list is
inspected as before (only slower).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The suite's architectures (vLLM registry names), roughly in the order it first loads them.
ARCHITECTURES = (
    "LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM", "EagleLlamaForCausalLM", "LlamaForCausalLMEagle3",
    "DeepSeekMTPModel", "OPTForCausalLM", "GPT2LMHeadModel", "Gemma2ForCausalLM",
    "GptOssForCausalLM", "Llama4ForCausalLM", "Ernie4_5_MoeForCausalLM", "Qwen3ForCausalLM",
    "Gemma3ForCausalLM", "Phi3ForCausalLM", "Starcoder2ForCausalLM", "MixtralForCausalLM",
    "OlmoeForCausalLM", "Qwen2MoeForCausalLM", "Glm4MoeForCausalLM", "DeepseekV2ForCausalLM",
    "MiniMaxM2ForCausalLM", "DeepseekV32ForCausalLM", "GraniteMoeHybridForCausalLM",
    "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen2_5_VLForConditionalGeneration",
    "LlavaForConditionalGeneration", "TransformersForSequenceClassification",
)


def start() -> subprocess.Popen | None:
    """Fill the cache in the background (output discarded); None when this list was filled
    into this cache before, for this vLLM."""
    if _marker().exists():
        return None
    return subprocess.Popen([sys.executable, "-m", "tests.helpers.model_info"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "VLLM_NO_USAGE_STATS": "1"})


def _marker() -> Path:
    """A file in the cache folder naming this list and vLLM's version (vLLM's entries are
    keyed by the model file's hash: another vLLM misses them)."""
    from importlib.metadata import version

    # vllm/envs.py's VLLM_CACHE_ROOT, without importing vLLM into the test process
    root = os.getenv("VLLM_CACHE_ROOT") or os.path.join(
        os.getenv("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
    tag = hashlib.sha256(repr((ARCHITECTURES, version("vllm"))).encode()).hexdigest()[:16]
    return Path(os.path.expanduser(root)) / "modelinfos" / f".vllm-npu-tests-{tag}"


def _fill() -> None:
    import vllm.model_executor.models.registry as registry

    registry._run_in_subprocess = lambda fn: fn()  # this process only inspects
    for arch in ARCHITECTURES:
        try:
            registry.ModelRegistry._try_inspect_model_cls(arch)
        except Exception:  # noqa: BLE001 - the engine that loads it will say why
            pass
    _marker().touch()


if __name__ == "__main__":
    _fill()
