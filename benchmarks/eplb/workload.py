"""Seeded synthetic MoE routing load for the EPLB benchmark.

Per layer, expert log-popularity = base (log-normal, sigma drawn per layer)
+ a mix of a few "domain" offsets + an AR(1) drift term + occasional hot
spots.  Each sub-window draws multinomial token counts::

    window w:  [ sub 0 | sub 1 | ... | sub T-1 ]   each sub = steps x tokens x D x top_k picks
    windows:   w0 -> w1 -> w2 ...                   (drift / domain shifts between them)

A token's top-k picks are drawn as k independent picks with each expert's
probability capped at 1/k (an expert cannot get more than one pick per token);
that keeps the counts' mean and spread right without simulating routing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Drift:
    """How fast popularity moves between sub-windows."""

    rho: float          # AR(1) persistence of the drift term per sub-window
    noise: float        # AR(1) innovation, in units of the layer's sigma
    domain_shift: float  # chance per window that the traffic's domain mix jumps
    hot_spot: float     # chance per window and layer that one expert turns hot


PRESETS: dict[str, Drift] = {
    "stable": Drift(rho=0.98, noise=0.02, domain_shift=0.0, hot_spot=0.0),
    "moderate": Drift(rho=0.95, noise=0.06, domain_shift=0.15, hot_spot=0.03),
    "shifting": Drift(rho=0.9, noise=0.15, domain_shift=0.5, hot_spot=0.1),
}


@dataclass(frozen=True)
class WorkloadConfig:
    num_layers: int = 58
    num_experts: int = 256
    top_k: int = 8
    num_ranks: int = 32
    tokens_per_rank: int = 128   # tokens per rank per step
    preset: str = "moderate"
    num_windows: int = 6
    sub_windows: int = 4
    steps_per_sub: int = 16
    num_domains: int = 4
    seed: int = 0


def _capped_probs(logits: np.ndarray, cap: float) -> np.ndarray:
    """Softmax per row with no probability above ``cap`` (mass spread to the rest)."""
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    for _ in range(20):
        over = p > cap
        if not over.any():
            break
        excess = np.where(over, p - cap, 0.0).sum(axis=-1, keepdims=True)
        p = np.where(over, cap, p)
        free = np.where(over, 0.0, p)
        p = p + free / np.maximum(free.sum(axis=-1, keepdims=True), 1e-300) * excess
    return p


def generate(cfg: WorkloadConfig) -> np.ndarray:
    """Token counts ``[W, T, L, E]`` (windows, sub-windows, layers, experts)."""
    if cfg.preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {cfg.preset!r}")
    drift = PRESETS[cfg.preset]
    rng = np.random.default_rng(cfg.seed)
    n_l, n_e, n_k = cfg.num_layers, cfg.num_experts, cfg.num_domains
    sigma = rng.uniform(0.5, 1.4, size=(n_l, 1))
    base = rng.normal(0.0, 1.0, size=(n_l, n_e)) * sigma
    domains = rng.normal(0.0, 0.6, size=(n_k, n_l, n_e)) * sigma
    mix = rng.dirichlet(np.ones(n_k))
    walk = np.zeros((n_l, n_e))
    hot = np.zeros((n_l, n_e))
    picks = cfg.steps_per_sub * cfg.tokens_per_rank * cfg.num_ranks * cfg.top_k
    out = np.empty((cfg.num_windows, cfg.sub_windows, n_l, n_e))
    for w in range(cfg.num_windows):
        if rng.random() < drift.domain_shift:
            mix = rng.dirichlet(np.full(n_k, 0.5))
        hot *= 0.5  # hot spots fade over a couple of windows
        spots = rng.random(n_l) < drift.hot_spot
        for layer in np.flatnonzero(spots):
            hot[layer, rng.integers(n_e)] += np.log(rng.uniform(4.0, 12.0))
        for t in range(cfg.sub_windows):
            walk = drift.rho * walk + drift.noise * sigma * rng.normal(size=(n_l, n_e))
            logits = base + np.tensordot(mix, domains, axes=1) + walk + hot
            p = _capped_probs(logits, 1.0 / cfg.top_k)
            for layer in range(n_l):
                out[w, t, layer] = rng.multinomial(picks, p[layer])
    return out
