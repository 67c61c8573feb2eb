"""The allow-list (allowlist.yaml): which upstream test files run, and how each test counts.

    files:
      tests/v1/core/test_scheduler.py:        # mode must-pass unless it says otherwise
        ci: true                               # part of the CI slice
        tests:                                 # per test: node id after `::`, name with
          test_x[param]: {mode: expected-fail, class: real-model, reason: "..."}
      tests/kernels/test_y.py: {mode: excluded, class: cuda, reason: "..."}
      tests/v1/engine/test_z.py:               # a module-level skip the NPU does not need
        lift_module_skip: {match: "regex of the skip's reason", reason: "why it is lifted"}
      tests/entrypoints/test_w.py:             # wall-clock budgets (servers up in 30 s):
        alone: "why"                           # run after the others, one at a time

    known_failures:                            # anywhere: a failure whose text matches
      - {match: "regex", class: device-rule, reason: "..."}   # counts as expected-fail

Every `expected-fail` or `excluded` entry carries a class and a reason; `plugin-bug` is a
class only while the bug is being fixed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

PATH = Path(__file__).with_name("allowlist.yaml")
MODES = ("must-pass", "expected-fail", "excluded")
CLASSES = {
    "cuda": "needs CUDA kernels or Triton",
    "real-model": "needs a real model's weights, vocabulary or text",
    "network": "needs the network",
    "other-device": "tests another platform's code (not a plugin's concern)",
    "device-rule": "assumes what the NPU refuses by design (the rule is cited)",
    "test-deps": "needs a package the simulated stack does not install",
    "simulator": ("asks torch for the accelerator device the simulated NPU does not register "
                  "(it runs on the host); torch_npu provides one on a device"),
    "platform-default": ("asserts a default or limit of vLLM's in-tree platforms that the NPU "
                         "platform sets otherwise by design (the reason names where)"),
    "npu-unsupported": ("a feature the NPU platform does not offer yet; it refuses it at "
                        "startup with an error naming what is valid"),
    "upstream-broken": "fails on every platform at v0.33.0: the test and vLLM's code disagree",
    "plugin-bug": "a plugin bug, while it is being fixed",
}
RULE_KEYS = {"mode", "class", "reason", "ci", "tests", "known_failures", "lift_module_skip",
             "alone"}
LIFT_KEYS = {"match", "reason"}
KNOWN_KEYS = {"match", "class", "reason"}


def check_rule(where: str, rule: dict) -> None:
    if not isinstance(rule, dict):
        raise ValueError(f"allow-list {where}: expected a mapping, got {rule!r}")
    unknown = set(rule) - RULE_KEYS
    if unknown:
        raise ValueError(f"allow-list {where}: unknown keys {sorted(unknown)}; "
                         f"valid: {sorted(RULE_KEYS)}")
    mode = rule.get("mode", "must-pass")
    if mode not in MODES:
        raise ValueError(f"allow-list {where}: mode {mode!r}; valid: {MODES}")
    if mode != "must-pass":
        if rule.get("class") not in CLASSES:
            raise ValueError(f"allow-list {where}: {mode} needs a class, one of "
                             f"{sorted(CLASSES)} (got {rule.get('class')!r})")
        if not str(rule.get("reason", "")).strip():
            raise ValueError(f"allow-list {where}: {mode} needs a reason")
    if "alone" in rule and not str(rule["alone"]).strip():
        raise ValueError(f"allow-list {where}: alone needs the reason (the budget the "
                         "tests hold to)")
    lift = rule.get("lift_module_skip")
    if lift is not None and (not isinstance(lift, dict) or set(lift) != LIFT_KEYS
                             or not str(lift["reason"]).strip()):
        raise ValueError(f"allow-list {where}: lift_module_skip needs exactly "
                         f"{sorted(LIFT_KEYS)}, got {lift!r}")


def check_known(where: str, known: list) -> None:
    for k in known:
        if not isinstance(k, dict) or set(k) != KNOWN_KEYS:
            raise ValueError(f"allow-list {where}: a known failure needs exactly "
                             f"{sorted(KNOWN_KEYS)}, got {k!r}")
        check_rule(where, {"mode": "expected-fail", "class": k["class"],
                           "reason": k["reason"]})
        re.compile(k["match"])


@dataclass
class AllowList:
    files: dict[str, dict]
    known_failures: list[dict]

    def entry(self, path: str) -> dict:
        """The file's rule, with the global known failures after its own."""
        entry = dict(self.files.get(path, {}))
        entry["known_failures"] = [*entry.get("known_failures", ()), *self.known_failures]
        return entry

    def files_to_run(self, ci: bool = False) -> list[str]:
        return sorted(p for p, e in self.files.items()
                      if e.get("mode", "must-pass") != "excluded" and (e.get("ci") or not ci))

    def excluded_files(self) -> dict[str, dict]:
        return {p: e for p, e in self.files.items() if e.get("mode") == "excluded"}


def load(path: Path = PATH) -> AllowList:
    data = yaml.safe_load(path.read_text()) or {}
    files = data.get("files") or {}
    known = data.get("known_failures") or []
    check_known("known_failures", known)
    for name, rule in files.items():
        rule = files[name] = rule or {}
        check_rule(name, rule)
        check_known(f"{name} known_failures", rule.get("known_failures") or [])
        for test, sub in (rule.get("tests") or {}).items():
            check_rule(f"{name}::{test}", sub)
    return AllowList(files, known)
