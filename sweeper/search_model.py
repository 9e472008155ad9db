"""The model ``bayes`` (``sweeper.search.ImprovementGridSampler``) keeps of a space's grid: the
features of every config (``Design``: one-hot main effects, log-scaled numeric knobs, pairwise
interactions, built on demand for grids too large to hold), the exact Bayesian linear
regression of log $/run over them with its marginal likelihood (``Posterior``), the knob pairs
expected to interact (``EXPECTED_PAIRS``, whose prior the evidence chooses), the memory order
of the configs (``MemoryOrder``, for the out-of-memory rule at grid scale) and the chance a
config's peak fits (``log_p_fits``, ``log_tokens``). Split from sweeper/search.py, which keeps
the samplers and what each trial tells them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.linalg
import scipy.special

from sweeper import knobs

# Knob pairs whose effects on throughput are expected not to add up (in log $/run), from how
# a training step works, not from the replay tables (bench/RESULTS.md, Search Run 14):
# - padding: an unpacked row is padded to the longest row of its batch or to max_seq_length,
#   so what packing (or padding-free batching) saves grows with the sequence length and with
#   the batch; at a length near the data's own, unpacked costs nothing;
# - the step's shape: tokens per step are batch x length, and a device's use saturates with
#   them (small steps are launch- and memory-bound, large ones compute-bound);
# - compilation: fusion and fewer kernel launches gain most on small steps, and max-autotune
#   chooses its kernels per shape;
# - attention: its cost grows with the square of the length, and the implementations differ
#   most at long sequences.
# Left out: the loader's knobs (they matter only when the loader is the bottleneck),
# gradient accumulation, checkpointing, precision and the optimizer (each scales the step by
# about one factor: additive in log $/run).
EXPECTED_PAIRS = frozenset(
    frozenset(pair)
    for pair in (
        ("packing", "max_seq_length"),
        ("packing", "per_device_batch_size"),
        ("padding_free", "max_seq_length"),
        ("padding_free", "per_device_batch_size"),
        ("per_device_batch_size", "max_seq_length"),
        ("compile_mode", "per_device_batch_size"),
        ("compile_mode", "max_seq_length"),
        ("attn_implementation", "max_seq_length"),
    )
)


class Posterior:
    """Bayesian linear regression y - mean(y) ~ x @ w, with w ~ N(0, diag(prior_var)) and
    Gaussian noise: the posterior mean of the weights, and the mean and variance of any new
    row's value. Exact either way, it takes the cheaper of two equal forms: over the n
    observations (an n x n Cholesky factor) while there are fewer of them than the F
    features, over the features (F x F) once there are more, so a long sweep's pick costs
    O(F^3 + m F^2) for m free configs instead of O(n^3 + m n^2)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, prior_var: np.ndarray, noise_sd: float):
        n, size = x.shape
        centered = y - y.mean()
        self.prior_var, self.noise_sd = prior_var, noise_sd
        self.by_observation = n <= size
        if self.by_observation:
            self.prior_x = x * prior_var  # n x F
            gram = self.prior_x @ x.T + noise_sd**2 * np.eye(n)
            self.factor = scipy.linalg.cholesky(gram, lower=True)
            alpha = scipy.linalg.cho_solve((self.factor, True), centered)
            self.weights = self.prior_x.T @ alpha
            fit = float(centered @ alpha)
            log_det = 2 * float(np.sum(np.log(np.diag(self.factor))))
        else:
            precision = x.T @ x / noise_sd**2 + np.diag(1 / prior_var)
            self.factor = scipy.linalg.cholesky(precision, lower=True)
            self.weights = scipy.linalg.cho_solve((self.factor, True), x.T @ centered) / (
                noise_sd**2
            )
            # the same by the matrix determinant and Woodbury identities
            fit = float(centered @ centered - centered @ x @ self.weights) / noise_sd**2
            log_det = (
                n * math.log(noise_sd**2)
                + float(np.sum(np.log(prior_var)))
                + 2 * float(np.sum(np.log(np.diag(self.factor))))
            )
        # log p(y - mean(y)) under the prior and the noise: the marginal likelihood
        self.log_evidence = -0.5 * (fit + log_det + n * math.log(2 * math.pi))

    def mean(self, features: np.ndarray) -> np.ndarray:
        return features @ self.weights

    def variance(self, features: np.ndarray) -> np.ndarray:
        if self.by_observation:
            prior = (features**2) @ self.prior_var
            reduced = scipy.linalg.solve_triangular(
                self.factor, self.prior_x @ features.T, lower=True
            )
            return prior - np.sum(reduced**2, axis=0)
        reduced = scipy.linalg.solve_triangular(self.factor, features.T, lower=True)
        return np.sum(reduced**2, axis=0)


def log_p_fits(mean: np.ndarray, sd: np.ndarray, low: float, high: float) -> np.ndarray:
    """log P(peak < capacity) for a log peak ~ N(mean, sd^2) and a log capacity uniform
    between ``low`` (the heaviest config that ran) and ``high`` (the lightest that did not)."""
    if high <= low:
        return scipy.special.log_ndtr((low - mean) / sd)

    def integral(z: np.ndarray) -> np.ndarray:  # of Phi: z Phi(z) + phi(z)
        return z * scipy.special.ndtr(z) + np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)

    share = sd * (integral((high - mean) / sd) - integral((low - mean) / sd)) / (high - low)
    return np.log(np.clip(share, 1e-12, 1.0))


CHECKPOINTED_SHARE = 1 / 3  # of the activations kept with gradient checkpointing: the prior


def log_tokens(params: Mapping[str, Any]) -> float:
    """log of the tokens of one step's activations: batch x sequence length, a third of it
    with gradient checkpointing (a knob the space does not search is the same for every
    config: it counts as 1)."""
    batch, length = params.get("per_device_batch_size"), params.get("max_seq_length")
    tokens = (batch if isinstance(batch, int) else 1) * (length if isinstance(length, int) else 1)
    share = CHECKPOINTED_SHARE if params.get("gradient_checkpointing") is True else 1.0
    return math.log(tokens * share)


def levels(values: Sequence[Any]) -> tuple[int, np.ndarray]:
    """How many distinct values there are, and each value's level (None is a level too)."""
    levels = {r: i for i, r in enumerate(sorted(set(map(repr, values))))}
    return len(levels), np.array([levels[repr(v)] for v in values])


class MemoryOrder:
    """The candidates' memory-relevant knobs as arrays, for ``oom_dominated`` at grid scale."""

    def __init__(self, candidates: Sequence[Mapping[str, Any]]) -> None:
        ranked, exact = [], []
        for name in sorted({n for c in candidates for n in c}):
            memory = knobs.KNOB[name].memory if name in knobs.KNOB else None
            values = [c.get(name) for c in candidates]
            if memory == knobs.FREE:
                continue
            if callable(memory) and all(v is not None for v in values):
                ranked.append([float(memory(v)) for v in values])
            else:
                exact.append(list(levels(values)[1]))
        n = len(candidates)
        self.ranked = np.array(ranked, dtype=float).T if ranked else np.zeros((n, 0))
        self.exact = np.array(exact, dtype=int).T if exact else np.zeros((n, 0), dtype=int)

    def dominated(self, oom: Sequence[int]) -> np.ndarray:
        """Which candidates weigh at least as much as one of the ``oom`` candidates."""
        heavy = np.zeros(len(self.ranked), dtype=bool)
        for j in oom:
            heavy |= np.all(self.ranked >= self.ranked[j], axis=1) & np.all(
                self.exact == self.exact[j], axis=1
            )
        return heavy


class Design:
    """The features of the candidates, built on demand (a grid of 75,000 configs with ~500
    features would not fit in memory as one matrix): a one-hot per (knob, value), log2 of each
    numeric knob scaled to a range of 1, and a one-hot per pair of values of two knobs."""

    def __init__(self, candidates: Sequence[Mapping[str, Any]]) -> None:
        names = sorted({name for c in candidates for name in c})
        self.codes: list[np.ndarray] = []  # per varying knob: each candidate's level
        self.names: list[str] = []  # per varying knob: its name
        self.kinds: list[str] = []  # per feature: main, numeric or pair
        self.numeric: list[tuple[int, np.ndarray]] = []  # (column, scaled log2 values)
        self.offsets: list[int] = []
        sizes: list[int] = []
        for name in names:
            # a knob absent from a config (inactive) is its own level
            values = [c.get(name) for c in candidates]
            count, codes = levels(values)
            if count < 2:
                continue
            self.codes.append(codes)
            self.names.append(name)
            self.offsets.append(len(self.kinds))
            sizes.append(count)
            self.kinds += ["main"] * count
            if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
                logs = np.log2(np.array(values, dtype=float))
                self.numeric.append((len(self.kinds), (logs - logs.mean()) / np.ptp(logs)))
                self.kinds.append("numeric")
        self.pairs: list[tuple[int, int, int, int]] = []  # (knob a, knob b, offset, size of b)
        # per feature: the names of the two knobs of a pair feature; empty for the others
        self.pair_knobs: list[frozenset[str]] = [frozenset()] * len(self.kinds)
        for a in range(len(self.codes)):
            for b in range(a + 1, len(self.codes)):
                self.pairs.append((a, b, len(self.kinds), sizes[b]))
                self.kinds += ["pair"] * (sizes[a] * sizes[b])
                self.pair_knobs += [frozenset((self.names[a], self.names[b]))] * (
                    sizes[a] * sizes[b]
                )
        self.size = max(1, len(self.kinds))
        if not self.kinds:
            self.kinds = ["main"]
            self.pair_knobs = [frozenset()]
        self._all: np.ndarray | None = None
        if len(candidates) * self.size <= self.CACHED:
            self._all = self._build(np.arange(len(candidates)))

    CACHED = 4_000_000  # features held for the whole grid when they take at most 32 MB

    def matrix(self, rows: np.ndarray) -> np.ndarray:
        """The features of the candidates ``rows``."""
        rows = np.asarray(rows, dtype=int)
        return self._all[rows] if self._all is not None else self._build(rows)

    def _build(self, rows: np.ndarray) -> np.ndarray:
        out = np.zeros((len(rows), self.size))
        at = np.arange(len(rows))
        for codes, offset in zip(self.codes, self.offsets, strict=True):
            out[at, offset + codes[rows]] = 1.0
        for column, values in self.numeric:
            out[:, column] = values[rows]
        for a, b, offset, size_b in self.pairs:
            out[at, offset + self.codes[a][rows] * size_b + self.codes[b][rows]] = 1.0
        return out

    def predict(self, rows: Sequence[int], weights: np.ndarray, chunk: int = 8192) -> np.ndarray:
        indexes = np.asarray(rows)
        return np.concatenate(
            [self.matrix(indexes[i : i + chunk]) @ weights for i in range(0, len(indexes), chunk)]
        )
