"""Workload families for judging EPLB policies away from the data they were tuned on.

Every family is a log-popularity process per layer and expert, sampled once per
sub-window and turned into top-k routing counts (no expert above 1/top_k of the picks,
:func:`benchmarks.eplb.workload._capped_probs`)::

    zipf       heavy head: rank r of a per-layer random order gets -a_l * log(r + 1),
               exponent a_l drawn per layer; top-2 routing (as top-1/top-2 routers give)
    lognormal  normal log-popularity, sigma drawn per layer; top-8
    domain     a mix of domain offsets that jumps to a new mix between windows; top-8
    bursty     log-normal base, experts turning hot for one to three sub-windows; top-8

Each adds an AR(1) walk in log-popularity (persistence ``rho``, innovation ``noise``
per sub-window), so the next window never equals the last. Seeds split in two:
:data:`TUNING_SEEDS` choose defaults, :data:`REPORT_SEEDS` give headline numbers.

:mod:`benchmarks.eplb.processes` adds other kinds of drift under the same config; of
those only :data:`~benchmarks.eplb.processes.TUNING_PROCESSES` were used to choose defaults
(:data:`TUNED_ON` lists every family and process defaults may be chosen on; the rest only
report).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.eplb.processes import PROCESSES, TUNING_PROCESSES, generate_process
from benchmarks.eplb.workload import _capped_probs

FAMILIES = ("zipf", "lognormal", "domain", "bursty")
ALL_FAMILIES = FAMILIES + PROCESSES
TUNED_ON = FAMILIES + TUNING_PROCESSES
TUNING_SEEDS = (0, 1, 2)
REPORT_SEEDS = (101, 102, 103, 104, 105)


@dataclass(frozen=True)
class FamilyConfig:
    family: str = "zipf"
    num_layers: int = 16
    num_experts: int = 256
    num_ranks: int = 64
    tokens_per_rank: int = 128   # tokens per rank per step
    num_windows: int = 5         # rebalances: plan on window w, score on window w + 1
    sub_windows: int = 8         # history a plan sees
    steps_per_sub: int = 8
    rho: float = 0.9             # AR(1) persistence per sub-window
    noise: float = 0.12          # AR(1) innovation per sub-window
    seed: int = 0

    @property
    def top_k(self) -> int:
        return 2 if self.family == "zipf" else 8


def _base(cfg: FamilyConfig, rng: np.random.Generator) -> np.ndarray:
    n_l, n_e = cfg.num_layers, cfg.num_experts
    if cfg.family == "zipf":
        expo = rng.uniform(0.6, 1.4, size=(n_l, 1))
        ranks = np.argsort(rng.random((n_l, n_e)), axis=1)
        return -expo * np.log(ranks + 1.0)
    sigma = rng.uniform(0.5, 1.4, size=(n_l, 1))
    return rng.normal(size=(n_l, n_e)) * sigma


def generate_family(cfg: FamilyConfig) -> np.ndarray:
    """Token counts ``[W + 1, T, L, E]``: one more window than rebalances, to score the last."""
    if cfg.family not in ALL_FAMILIES:
        raise ValueError(f"family must be one of {ALL_FAMILIES}, got {cfg.family!r}")
    picks = cfg.steps_per_sub * cfg.tokens_per_rank * cfg.num_ranks * cfg.top_k
    if cfg.family in PROCESSES:
        return generate_process(cfg.family, cfg.num_layers, cfg.num_experts, picks,
                                cfg.num_windows + 1, cfg.sub_windows, cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    n_w, n_t, n_l, n_e = cfg.num_windows + 1, cfg.sub_windows, cfg.num_layers, cfg.num_experts
    base = _base(cfg, rng)
    domains = rng.normal(0.0, 0.8, size=(4, n_l, n_e)) if cfg.family == "domain" else None
    mix = rng.dirichlet(np.ones(4))
    walk = np.zeros((n_l, n_e))
    hot = np.zeros((n_l, n_e))
    out = np.empty((n_w, n_t, n_l, n_e))
    for w in range(n_w):
        if domains is not None and rng.random() < 0.5:
            mix = rng.dirichlet(np.full(4, 0.5))
        for t in range(n_t):
            walk = cfg.rho * walk + cfg.noise * rng.normal(size=(n_l, n_e))
            logits = base + walk
            if domains is not None:
                logits = logits + np.tensordot(mix, domains, axes=1)
            if cfg.family == "bursty":
                hot *= rng.random((n_l, n_e)) < 0.6   # a burst lasts ~1-3 sub-windows
                starts = rng.random((n_l, n_e)) < 0.004
                hot = np.where(starts, np.log(rng.uniform(3.0, 10.0, size=(n_l, n_e))), hot)
                logits = logits + hot
            p = _capped_probs(logits, 1.0 / cfg.top_k)
            for layer in range(n_l):
                out[w, t, layer] = rng.multinomial(picks, p[layer])
    return out
