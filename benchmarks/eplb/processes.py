"""Drift processes for EPLB policies: each a different way expert popularity changes over
time, not another seed of one (the families in :mod:`benchmarks.eplb.families` are AR(1)
walks around a fixed base, plus domain jumps or short bursts)::

    walk        popularity wanders with no pull back: a random walk in log-popularity
    regime      the prompt mix switches abruptly, at any sub-window, among three regimes
                (and may switch back)
    flash       experts turn hot (x3 to x20) for about a window and a half, then cool off
    groups      experts rise and fall together: eight random groups, each with its own
                activity moving sub-window to sub-window (AR(1)), over a fixed base
    steady      nothing drifts: a fixed log-normal base under noise that forgets within a
                few sub-windows (AR(1), persistence 0.5), so the recent past predicts the
                next window no better than the long-run mix
    correlated  layers share their hot sets: one latent popularity per expert index, with
                its own drift, drives every layer (weight 0.6-0.95 per layer)
    heavy       heavy tails: Pareto popularity, the top expert of a layer near 10x its share
    trace       the shape published expert-activation traces report: a mixture of domain
                routings whose mix moves batch to batch, imbalance that varies across
                layers, and heavy hitters common to every domain

``trace`` follows two studies of real routing: expert traces of DeepSeek-V3, Qwen3-235B
and Llama 4 Maverick show domain-specific expert activation and load imbalance that
varies across layers and models (arXiv:2604.23150), and the overall expert workload is
estimable from a small calibration set, i.e. a stable heavy-hitter core under the
per-batch variation (arXiv:2602.19938). Every process routes top-8 with no expert above
1/8 of the picks.

Split: :data:`TUNING_PROCESSES` may choose defaults; :data:`REPORT_PROCESSES` only
report (with the families' :data:`~benchmarks.eplb.families.REPORT_SEEDS`).
"""

from __future__ import annotations

import numpy as np

from benchmarks.eplb.workload import _capped_probs

TUNING_PROCESSES = ("walk", "flash", "groups", "steady")
REPORT_PROCESSES = ("regime", "correlated", "heavy", "trace")
PROCESSES = TUNING_PROCESSES + REPORT_PROCESSES


class _Walk:
    def __init__(self, rng, n_l, n_e):
        self.rng = rng
        self.base = rng.normal(size=(n_l, n_e)) * rng.uniform(0.5, 1.2, size=(n_l, 1))
        self.step = rng.uniform(0.04, 0.10, size=(n_l, 1))
        self.x = np.zeros((n_l, n_e))

    def next(self):
        self.x = self.x + self.step * self.rng.normal(size=self.x.shape)
        return self.base + self.x


class _Regime:
    def __init__(self, rng, n_l, n_e):
        self.rng = rng
        self.regimes = rng.normal(size=(3, n_l, n_e)) * rng.uniform(0.6, 1.3, size=(3, n_l, 1))
        self.current = 0
        self.noise = np.zeros((n_l, n_e))

    def next(self):
        if self.rng.random() < 1.0 / 12:  # about once in a window and a half
            self.current = int(self.rng.choice([r for r in range(3) if r != self.current]))
        self.noise = 0.9 * self.noise + 0.05 * self.rng.normal(size=self.noise.shape)
        return self.regimes[self.current] + self.noise


class _Flash:
    def __init__(self, rng, n_l, n_e):
        self.rng = rng
        self.base = rng.normal(size=(n_l, n_e)) * rng.uniform(0.5, 1.0, size=(n_l, 1))
        self.hot = np.zeros((n_l, n_e))
        self.noise = np.zeros((n_l, n_e))

    def next(self):
        shape = self.hot.shape
        self.hot *= self.rng.random(shape) < 0.92  # stays hot ~12 sub-windows on average
        starts = (self.rng.random(shape) < 0.002) & (self.hot == 0)
        self.hot = np.where(starts, np.log(self.rng.uniform(3.0, 20.0, size=shape)), self.hot)
        self.noise = 0.9 * self.noise + 0.05 * self.rng.normal(size=shape)
        return self.base + self.hot + self.noise


class _Groups:
    def __init__(self, rng, n_l, n_e, groups=8):
        self.rng = rng
        self.base = rng.normal(size=(n_l, n_e)) * rng.uniform(0.4, 1.0, size=(n_l, 1))
        self.group = rng.integers(0, groups, size=(n_l, n_e))
        self.activity = np.zeros((n_l, groups))

    def next(self):
        self.activity = 0.7 * self.activity + 0.35 * self.rng.normal(size=self.activity.shape)
        return self.base + np.take_along_axis(self.activity, self.group, axis=1)


class _Steady:
    def __init__(self, rng, n_l, n_e):
        self.rng = rng
        self.base = rng.normal(size=(n_l, n_e)) * rng.uniform(0.5, 1.3, size=(n_l, 1))
        self.noise = np.zeros((n_l, n_e))

    def next(self):
        self.noise = 0.5 * self.noise + 0.3 * self.rng.normal(size=self.noise.shape)
        return self.base + self.noise


class _Correlated:
    def __init__(self, rng, n_l, n_e):
        self.rng = rng
        self.shared = rng.normal(size=(1, n_e))
        self.own = rng.normal(size=(n_l, n_e))
        self.weight = rng.uniform(0.6, 0.95, size=(n_l, 1))
        self.scale = rng.uniform(0.5, 1.0, size=(n_l, 1))
        self.drift = np.zeros((1, n_e))

    def next(self):
        self.drift = 0.95 * self.drift + 0.12 * self.rng.normal(size=self.drift.shape)
        w = self.weight
        return self.scale * (w * (self.shared + self.drift) + np.sqrt(1 - w * w) * self.own)


class _Heavy:
    def __init__(self, rng, n_l, n_e):
        self.rng = rng
        x = np.log(rng.pareto(rng.uniform(1.1, 1.6, size=(n_l, 1)), size=(n_l, n_e)) + 1.0)
        # temper each layer's tail (x * t) so that its top expert takes 10x the mean share
        lo, hi = np.zeros((n_l, 1)), np.full((n_l, 1), 8.0)
        for _ in range(50):
            t = (lo + hi) / 2
            p = np.exp(x * t - (x * t).max(axis=1, keepdims=True))
            top = (p.max(axis=1) / p.sum(axis=1) * n_e)[:, None]
            lo, hi = np.where(top < 10.0, t, lo), np.where(top < 10.0, hi, t)
        self.base = x * (lo + hi) / 2
        self.noise = np.zeros((n_l, n_e))

    def next(self):
        self.noise = 0.9 * self.noise + 0.08 * self.rng.normal(size=self.noise.shape)
        return self.base + self.noise


class _Trace:
    def __init__(self, rng, n_l, n_e, domains=6):
        self.rng = rng
        sigma = rng.uniform(0.4, 1.8, size=(1, n_l, 1))  # imbalance varies across layers
        logits = rng.normal(size=(domains, n_l, n_e)) * sigma
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        self.domain_p = p / p.sum(axis=-1, keepdims=True)
        common = rng.normal(size=(n_l, n_e)) * sigma[0] * 1.2
        c = np.exp(common - common.max(axis=-1, keepdims=True))
        self.common_p = c / c.sum(axis=-1, keepdims=True)
        self.mix = rng.dirichlet(np.full(domains, 2.0))

    def next(self):
        # a batch keeps most of its running requests and admits new ones of other domains
        self.mix = 0.6 * self.mix + 0.4 * self.rng.dirichlet(np.full(self.mix.size, 0.7))
        p = 0.3 * self.common_p + 0.7 * np.tensordot(self.mix, self.domain_p, axes=1)
        return np.log(p)


_KINDS = {"walk": _Walk, "regime": _Regime, "flash": _Flash, "groups": _Groups,
          "steady": _Steady, "correlated": _Correlated, "heavy": _Heavy, "trace": _Trace}


def generate_process(name: str, num_layers: int, num_experts: int, picks: int,
                     num_windows: int, sub_windows: int, seed: int) -> np.ndarray:
    """Token/expert pairs ``[W, T, L, E]`` of process ``name`` (``picks`` per sub-window and
    layer, top-8 routing)."""
    if name not in _KINDS:
        raise ValueError(f"process must be one of {PROCESSES}, got {name!r}")
    rng = np.random.default_rng(seed)
    proc = _KINDS[name](rng, num_layers, num_experts)
    out = np.empty((num_windows, sub_windows, num_layers, num_experts))
    for w in range(num_windows):
        for t in range(sub_windows):
            p = _capped_probs(proc.next(), 1.0 / 8)
            for layer in range(num_layers):
                out[w, t, layer] = rng.multinomial(picks, p[layer])
    return out
