"""How a sweep picks its next config: the sampler (``search.sampler``), what it is told about
each config, and which configs are not worth running.

- **Every config tells the sampler something true.** A measured config is told with its $/run;
  a config proposed again is told its measured value again (never "pruned", which Optuna's
  samplers rank below every completed trial: a re-proposed good config would teach the sampler
  that its best region is bad).
- **Config-caused failures are constraints, not failures.** An out-of-memory trial (or another
  failure the config itself causes: ``INFEASIBLE_KINDS``) is told as a completed, infeasible
  trial (Optuna's ``Trial.set_constraint``), so the samplers that read constraints (TPE, GP,
  ``bayes``) learn the feasible region; Optuna's samplers ignore FAIL trials, so a failed
  config's neighbours were proposed again and again.
- **A config at least as heavy as one that ran out of memory is not run** (``oom_dominated``).
- **The sampler is chosen by measurement**: ``bench/search_replay.py`` replays the sweep's own
  loop on measured and synthetic tables; ``sweeper.samplers.DEFAULT_SAMPLER`` is the one that
  needs the fewest trials there (bench/RESULTS.md). Each worker gets its own seed (``worker_seed``).

``bayes`` is sweeper's own: a Bayesian linear model of log $/run over the space's finite grid
(one-hot main effects, log-scaled numeric knobs, pairwise interactions). It never proposes a
measured or running config; among the others it picks the one most likely to beat the best
$/run by more than the noise, so it explores where the model is unsure and exploits where it
is sure.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
import scipy.linalg
import scipy.special
import threadpoolctl
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from sweeper import knobs, search_cost
from sweeper.samplers import SAMPLERS
from sweeper.search_cost import COMPILE_S, SECONDS_ATTR
from sweeper.search_model import (
    EXPECTED_PAIRS,
    Design,
    MemoryOrder,
    Posterior,
    levels,
    log_p_fits,
    log_tokens,
)

__all__ = ["COMPILE_S", "SECONDS_ATTR"]  # where the bench and the tests have found them

# failures the config itself causes: told to the sampler as infeasible, not as failed
INFEASIBLE_KINDS = frozenset(
    {"oom", "unsupported", "compile", "nonfinite", "dataloader", "mismatch"}
)

CONSTRAINT = "runs_here"  # Optuna constraint (Trial.set_constraint): 1 infeasible, 0 feasible
REPEAT_ATTR = "repeat_of"  # user attr: the trial number whose measurement this re-tells
CONTENDED_ATTR = "contended"  # user attr: every measurement was taken on a shared machine
WORKER_ATTR = "worker"  # user attr: the id of the study's worker that asked for the trial


def trials_took(
    trials: Iterable[FrozenTrial], default_mode: Any
) -> tuple[list[tuple[Any, float]], list[bool]]:
    """(compile mode, seconds) of each trial that ran to its end (measured, or failed by the
    config's own doing), in trial order: what a trial of each mode is expected to take
    (``sweeper.search_cost``); and beside each, whether it was measured (not failed). A
    trial whose config has no ``compile_mode`` parameter (the space lists one mode) is
    ``default_mode``'s. A re-told repeat did not run; a failed trial (a budget cut it, a
    bug) is not told to samplers, and says nothing of its config's time."""
    took, ran = [], []
    for t in sorted(trials, key=lambda t: t.number):
        if t.state != TrialState.COMPLETE or REPEAT_ATTR in t.user_attrs:
            continue
        seconds = search_cost.trial_seconds(t)
        if seconds is not None:
            took.append((t.params.get("compile_mode", default_mode), seconds))
            ran.append(not infeasible(t))
    return took, ran


def infeasible(trial: FrozenTrial) -> bool:
    """Whether the trial was told as a config that cannot run here."""
    return any(v > 0 for v in trial.constraints.values())


def worker_seed(seed: int, worker: str) -> int:
    """The sampler seed of one worker of a study: the space's seed for the first (``worker``
    "0"), a different one, stable across restarts, for every other.

    >>> worker_seed(0, "0"), worker_seed(0, "1") == worker_seed(0, "1"), worker_seed(0, "1") != 0
    (0, True, True)
    """
    if worker == "0":
        return seed
    digest = hashlib.sha256(f"{seed}:{worker}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


# ------------------------------------------------------------------ out of memory


def oom_dominated(
    config: Mapping[str, Any], known_oom: Iterable[tuple[int, Mapping[str, Any]]]
) -> int | None:
    """The number of a trial that ran out of memory with a config ``config`` weighs at least as
    much as on every knob (``knobs.Knob.memory``), or None.

    >>> oom = [(3, {"per_device_batch_size": 8, "max_seq_length": 1024, "num_workers": 0,
    ...             "compile_mode": "none", "gradient_checkpointing": False})]
    >>> heavier = {"per_device_batch_size": 16, "max_seq_length": 1024, "num_workers": 4,
    ...            "compile_mode": "none", "gradient_checkpointing": False}
    >>> oom_dominated(heavier, oom)
    3
    >>> oom_dominated(heavier | {"gradient_checkpointing": True}, oom) is None  # lighter
    True
    >>> oom_dominated(heavier | {"compile_mode": "default"}, oom) is None  # unknown effect
    True
    """
    for number, oom in known_oom:
        if all(_at_least_as_heavy(name, config.get(name), oom.get(name)) for name in knobs.NAMES):
            return number
    return None


def _at_least_as_heavy(name: str, value: Any, than: Any) -> bool:
    memory = knobs.KNOB[name].memory
    if memory == knobs.FREE or value == than:
        return True
    if memory is None or isinstance(memory, str) or value is None or than is None:
        return False
    return memory(value) >= memory(than)


# ------------------------------------------------------------------ samplers


def make_sampler(
    name: str, seed: int, candidates: Sequence[Mapping[str, Any]]
) -> optuna.samplers.BaseSampler:
    """The Optuna sampler ``search.sampler`` names. ``candidates``: the Optuna parameters of
    every config the sweep may run (``optuna_params`` of the runnable grid).

    Every sampler knows the trials other workers are running: ``bayes`` and ``grid`` never
    pick a running config, TPE treats a running trial as a bad result until it ends (the
    constant liar), and Optuna's GP sampler conditions on running trials."""
    if name == "bayes":
        return ImprovementGridSampler(candidates, seed=seed)
    if name == "grid":
        return ShuffledGridSampler(candidates, seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name == "tpe-multivariate":
        with warnings.catch_warnings():  # multivariate and group are "experimental" in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=True
            )
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; use one of {', '.join(SAMPLERS)}")


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


class _CandidateSampler(BaseSampler):
    """A sampler that picks a whole config from a finite list before the trial asks for its
    parameters (``before_trial``), then answers each ``suggest_categorical`` from it. Configs
    that are measured or running (in any worker's trials) are never picked."""

    def __init__(self, candidates: Sequence[Mapping[str, Any]], *, seed: int | None) -> None:
        self.candidates = [dict(c) for c in candidates]
        self._keys = [_key(c) for c in self.candidates]
        self.rng = np.random.default_rng(seed)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._picked: dict[int, dict[str, Any]] = {}

    def reseed_rng(self) -> None:
        self.rng = np.random.default_rng()
        self._fallback.reseed_rng()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if trial.params or trial.system_attrs.get("fixed_params"):
            return  # an enqueued config (the baseline, also_try, a REST request)
        trials = study.get_trials(deepcopy=False)
        taken = {_key(t.params) for t in trials if t.state != TrialState.WAITING and t.params}
        free = [i for i, key in enumerate(self._keys) if key not in taken]
        if free:
            # one BLAS thread: these matrices are small, and on a machine whose cores are
            # busy (DataLoader workers, other sweeps) OpenBLAS's threads waiting on each other
            # made a 210 x 210 Cholesky 70x slower (28 ms instead of 0.4)
            with threadpoolctl.threadpool_limits(1, user_api="blas"):
                picked = self.pick(free, trials)
            self._picked[trial._trial_id] = self.candidates[picked]

    def pick(self, free: list[int], trials: list[FrozenTrial]) -> int:
        raise NotImplementedError

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        picked = self._picked.get(trial._trial_id, {})
        if param_name in picked and param_distribution._contains(
            param_distribution.to_internal_repr(picked[param_name])
        ):
            return picked[param_name]
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._picked.pop(trial._trial_id, None)


class ShuffledGridSampler(_CandidateSampler):
    """Every config once, in a seeded random order (random search without repeats)."""

    def pick(self, free: list[int], trials: list[FrozenTrial]) -> int:
        return int(self.rng.choice(free))


class ImprovementGridSampler(_CandidateSampler):
    """Bayesian linear regression of log $/run over the grid; each pick is the free config most
    likely to beat the best measured $/run by more than the noise (probability of improvement).

    Features of a config: a one-hot per (knob, value); log2 of each numeric knob; pairwise
    products of the one-hots of different knobs (interactions, with a tighter prior; for the
    knob pairs expected to interact, ``EXPECTED_PAIRS``, its sd is chosen at each pick by the
    marginal likelihood, ``expected_pairs_fit``). The
    posterior's mean and spread of each free config are exact (a Gaussian prior on the weights;
    ``Posterior``). Measured trials enter the regression; trials slowed by a shared machine
    (``CONTENDED_ATTR``) do not, until the sweep measures them calm (``revise``). Failures stay
    out of the cost regression: a config that a linear model of "failed" against "ran" (one for
    out-of-memory, one for the other failures) confidently puts at even odds or worse is not
    picked, and neither is a config at least as heavy as one that ran out of memory, one the
    model of peak memory (tokens per step, from the first measured trial: ``_fits``) says
    will not fit, or the model of a config that failed to compile with other DataLoader
    settings (the wall is sharp and the best config often sits next to it, so a failure must
    not make its knob values look slow).

    Among the configs left, the chance of improving is weighed by the chance that the config
    runs (``feasibility_weight``): where its predicted peak memory lies between the heaviest
    config that ran and the lightest that ran out of memory, and the failure model's chance
    that it fails otherwise. A pick is then the config most likely to run and improve, so a
    space that mostly fails is searched from its feasible side (bench/RESULTS.md, Run 7).

    After an out-of-memory failure and before anything was measured, the pick is drawn from
    the lightest quarter of the configs (most of a space may run out of memory). The expected
    seconds of each trial are learned per compile mode; ``fits`` (set by the sweep loop before
    each ask, near the end of a time budget) leaves out the configs whose trial would not
    finish in the time left, so the pick is the best config that can finish
    (``sweeper.search_cost.fit_seconds``); ``cost_weight`` can make a trial
    dearer than the best measured config's count against its chance among near-ties
    (``sweeper.search_cost``; off by default: bench/RESULTS.md, Run 9).

    On the replay tables this needs about half the trials that Thompson sampling with the same
    model needed (bench/RESULTS.md).
    """

    main_prior_sd = 0.5  # log $/run: one knob value may halve or double the cost
    numeric_prior_sd = 2.0  # log2(batch) from its smallest to largest value: up to ~7-fold
    interaction_prior_sd = 0.05  # chosen on the replay tables (0.02-0.3 tried, 40 seeds)
    noise_sd = 0.1  # ~10% run-to-run spread of a short trial
    improvement = 0.05  # log $/run: the gain a pick must be likely to bring (beyond the noise)
    failure_margin_sd = 0.5  # how sure the failure model must be to leave a config out
    chunk = 4096  # free configs scored at once
    # the time weighing (sweeper.search_cost.pick): among the configs at least cost_window
    # as likely to run and improve as the likeliest, the chance per second of trial beyond
    # the incumbent's, to the power cost_weight; a compile mode measured fewer than
    # cost_after times counts as the cheapest. Off (0): at weight 1 it lost trials on noisy
    # samples/s (15 against 13 to 5%, 1.15x the seconds, 40 paired seeds) and qlora-24gb
    # (18.5 against 17, 1.13-1.23x the seconds, 20), though it won on interactions (11.5 / 15
    # against 12.5 / 14.5, 0.82 / 0.90 of the seconds, 40; bench/RESULTS.md, Run 9)
    cost_weight = 0.0
    cost_window = 0.9
    cost_after = 1
    # "cheapest": seconds beyond the cheapest candidate's count (the strict tie breaker,
    # weight 10, window 0.95: 22 / 20.5 against 16 / 15.5 trials on held-out, 30 seeds);
    # cost_cooling > 0: the weight falls to 0 over that many measured trials (CArBO; weight
    # 1, window 0.5: 17.5 against 13 on noisy samples/s, 40 seeds; bench/RESULTS.md Run 10)
    cost_against = "incumbent"
    cost_cooling = 0
    # "ei": the score weighed is the expected improvement of log $/run below the best less
    # ``improvement`` (not its probability), so time is weighed as expected improvement per
    # second (EIpu; with cost_cooling, CArBO's); a window of 0 weighs it among all configs.
    # "pi" by default: EIpu (weight 1, window 0) took more trials to 5% on every table with
    # compile modes (noisy 16 / 24 against 10.5 / 16.5, 100 paired seeds; held-out 18 / 19.5
    # against 16 / 15.5, 30), and EI alone took more than PI on interactions (11.5 / 21
    # against 9.5 / 14, 100; bench/RESULTS.md Run 12)
    cost_acquisition = "pi"
    # the draws made before anything is measured (the first pick, the light pick after an
    # out of memory) draw among the configs of the cheapest expected trial. Off: the changed
    # first pick reshuffles every later one, and the first compile it saves is smaller than
    # that spread (oom-wall tokens/s 13.5 against 12 trials to 5%, interactions samples/s
    # 1.26x the summed seconds, 30 paired seeds; bench/RESULTS.md Run 16); at 200 seeds it
    # loses trials where feasibility is narrow (qlora-24gb 17.5 / 18 against 15; Run 17)
    cheap_draws = False
    # > 0: the time weighing counts only while no config is at least this likely to run and
    # improve (the pick explores: what it buys is information, and a cheaper trial buys it
    # for less); a pick the model expects to improve runs whatever it costs. 0: always.
    # (0.3 at weight 1, window 0.5: on held-out's tokens/s 13 seeds worse and 0 better of
    # 48, 1.07x the seconds over both metrics, 60 seeds; bench/RESULTS.md Run 19)
    cost_explore_below = 0.0
    # > 0: the first picks, up to this many measured configs, are made among the configs of
    # the cheapest expected trial (its compile mode), each by its chance of beating the best
    # of them, until none is at least cheap_first_below likely to (what the other knobs do is
    # learned where a trial costs least); then the whole space, the compiled modes' effects
    # learned from their first trials. 0: off. 3 by default since Run 19: judged on 140
    # fresh seeds a table (200-339), 0.906x the seconds to 5% [0.869, 0.946] over the 12
    # rows, no row needing more trials by the sign test at p < 0.005 (the closest: noisy
    # samples/s, 68 seeds worse and 52 better, median 18 against 14; over all rows 777 worse
    # and 726 better). 6 lost trials on five rows (noisy and interactions samples/s 12-14
    # against 10-10.5, held-out-lora 16 against 13; bench/RESULTS.md Run 19)
    cheap_first = 3
    cheap_first_below = 0.25
    # The options below were measured against the heavy tail of this search on samples/s
    # (28% of seeds at 40+ trials to 5% on interactions, 20% on noisy, 40 seeds) and left
    # off: the tail comes from a model sure of an additive effect measured in one region
    # (unpacked is slow, learned at long sequences), not from a lucky incumbent
    # (interactions has no noise); none lowered the share at 40+ without costing the median
    # (bench/RESULTS.md, Run 13).
    # What a pick must beat: "measured", the lowest measured log $/run; "posterior", the
    # lowest posterior mean over the measured configs (noisy BO's plug-in: 21 against 17
    # trials on noisy tokens/s, the tail unchanged)
    incumbent = "measured"
    # empirical Bayes: the interaction prior's sd is, at each pick, the one of these that
    # makes the measured log $/run likeliest (the marginal likelihood); empty: always
    # interaction_prior_sd; set, it replaces expected_pairs_fit (every pair by one sd).
    # (0.05-0.4: the evidence keeps 0.05, the tail unchanged; 0.2
    # alone shortened it, p90 108.5 -> 69.3 on interactions, but lost noisy tokens/s)
    interaction_prior_fit: tuple[float, ...] = ()
    # when no free config is at least this likely to improve, the pick is the config the
    # model knows least (its largest posterior spread), or one at random, weighed by
    # P(it runs) the same way; 0: never. (0.01: the spreads are nearly equal once every
    # knob value is measured, interactions' tail unchanged; at random, the search turns
    # into random search, up to 430 trials)
    explore_below = 0.0
    explore_by = "spread"
    # while fewer than this many configs are measured, the pick (after the random first) is
    # the config of largest posterior spread under a wide interaction prior (sd 0.5): pairs
    # of values covered before the model is trusted; 0: none. (5: the tail's share on
    # interactions samples/s 11 -> 6 of 40 seeds, but the medians on samples/s 2.5-3.5
    # trials higher; 3 the same)
    explore_first = 0
    # the interaction prior's sd of the knob pairs in EXPECTED_PAIRS (those whose
    # interaction in throughput is expected from how a step works: padding, the step's
    # shape, compilation) while expected_pairs_fit is empty; the other pairs keep
    # interaction_prior_sd; 0: every pair keeps it.
    # (0.4: the tail's share on samples/s 8 -> 0 of 40 seeds on noisy, 11 -> 1 on
    # interactions, interactions' medians unchanged; but noisy's medians 3-3.5 trials higher,
    # 16 / 20.5 against 13 / 17, and a new tail on its tokens/s; 0.2 the same; Run 14)
    expected_pairs_sd = 0.0
    # empirical Bayes for the expected pairs only: at each pick their interaction prior's sd
    # is the one of these that makes the measured log $/run likeliest (the marginal
    # likelihood; the other pairs keep interaction_prior_sd), so the data decide whether
    # they support the expected interactions; empty: expected_pairs_sd. The default since
    # Run 15: it lowered the samples/s tail (40 paired seeds: noisy 8 -> 5 at 40+ trials to
    # 5%, p90 72.8 -> 47.8; interactions 11 -> 10, p90 108.5 -> 99.3) with every table's
    # median at most 1 trial above (held-out-lora 16 against 15; noisy 13 and 16.5 against
    # 13 and 17), where the fixed 0.4 cost noisy 3-3.5 trials
    expected_pairs_fit: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4)
    # the noise sd chosen jointly with the fitted priors, among these; empty: noise_sd.
    # (0.05-0.2 with expected_pairs_fit: noisy samples/s 15 against 13 trials to 5%; Run 15)
    noise_fit: tuple[float, ...] = ()
    memory_margin_sd = 0.3  # how sure the memory model must be to leave a config out
    wall_share = 0.5  # where between the heaviest run and the lightest out of memory to cut
    # each pick weighs its chance of improving by its chance of running, to this power
    # (0.5; 1 took more trials on qlora-24gb, bench/RESULTS.md Run 7): P(it fits) from the
    # memory model, P(no other failure) from the failure model
    feasibility_weight = 0.5
    failure_pair_prior_sd = 0.2  # the failure model: a compile mode fails with one other knob
    failure_cap = 0.95  # the failure model's linear P(fails) is read as at most this
    memory_measurement_sd = 0.05  # of one trial's log peak memory
    # P(it fits) counts to this power within P(it runs): at 1, held-out's best configs (at
    # its wall) waited 1-2 trials longer; at 0.5 oom-wall's best (next to its wall) waited
    # 2-2.5 (14.5 / 14 against 12 / 12); at 0.25 oom-wall 11.5 / 12 and qlora-24gb 18 / 17.5
    # trials, 31% of them failed against random's 47% (0.5: 24%; bench/RESULTS.md, Run 8)
    fits_weight = 0.25

    def __init__(self, candidates: Sequence[Mapping[str, Any]], *, seed: int | None) -> None:
        super().__init__(candidates, seed=seed)
        self.design = Design(self.candidates)
        sd = {"main": self.main_prior_sd, "numeric": self.numeric_prior_sd,
              "pair": self.interaction_prior_sd}  # fmt: skip
        self.prior_var = np.array([sd[k] for k in self.design.kinds]) ** 2
        # the pair features of the knob pairs whose interaction physics expects
        self._expected = np.array([k in EXPECTED_PAIRS for k in self.design.pair_knobs])
        if self.expected_pairs_sd > 0:
            self.prior_var = np.where(self._expected, self.expected_pairs_sd**2, self.prior_var)
        # failed (1) or ran (0): a knob value, or a pair of values (max-autotune with
        # checkpointing), makes a config fail; numeric knobs by their size
        failure_sd = {"main": 0.2, "numeric": 3.0, "pair": self.failure_pair_prior_sd}
        self.failure_prior_var = np.array([failure_sd[k] for k in self.design.kinds]) ** 2
        self._index = {_key(c): i for i, c in enumerate(self.candidates)}
        self._memory = MemoryOrder(self.candidates)
        # log tokens per step (batch x sequence length): what activations grow with
        self._log_tokens = np.array([log_tokens(c) for c in self.candidates])
        # log peak memory per token of a step, less its mean: how each knob value moves it
        # (checkpointing keeps about a third; the fixed weights make small steps dearer)
        residual_sd = {"main": 0.7, "numeric": 1.0, "pair": 0.1}
        self.per_token_prior_var = np.array([residual_sd[k] for k in self.design.kinds]) ** 2
        self._revised: dict[tuple[tuple[str, Any], ...], float] = {}
        # each candidate's model side (its knobs less the loader's), as one level
        self._model_side = levels(
            [tuple(sorted((n, v) for n, v in c.items() if n not in _LOADER_KNOBS))
             for c in self.candidates]
        )[1]  # fmt: skip

    # which configs (by their Optuna parameters) can finish in the sweep's time left; None:
    # all can (no time budget, or plenty left). Set by the sweep loop before each ask
    fits: Callable[[Mapping[str, Any]], bool] | None = None

    def revise(self, params: Mapping[str, Any], cost: float) -> None:
        """A config told as contended was measured calm later: its $/run joins the model."""
        self._revised[_key(params)] = cost

    def pick(self, free: list[int], trials: list[FrozenTrial]) -> int:
        seen = self._history(trials)
        rows, values, oom, failed, memory = (
            seen.rows,
            seen.values,
            seen.oom,
            seen.failed,
            seen.memory,
        )
        if seen.model_failed:  # the same model with other loader settings fails the same
            free = [i for i in free if int(self._model_side[i]) not in seen.model_failed] or free
        # log P(the config runs) of each candidate, as far as the models below know
        log_runs = np.zeros(len(self.candidates))
        if oom:
            heavy = self._memory.dominated(oom)
            free = [i for i in free if not heavy[i]] or free
            free = self._fits(free, oom, memory, log_runs)
        # one model per cause: out of memory (batch x length) and the others (a compile mode
        # with checkpointing...) have different shapes, and one model of both blamed a knob
        # for the other's failures (checkpointing, which lets the big batches fit)
        for failures, soft in ((oom, not memory), (failed, True)):
            if failures:
                free = self._unlike(free, failures, rows, log_runs if soft else None)
        if self.fits is not None:  # the best config that can finish, by the same scores
            free = [i for i in free if self.fits(self.candidates[i])] or free
        free, log_p_cheap = self._cheap_first(free, seen)
        if not rows:  # nothing measured yet
            if self.cheap_draws:  # a draw tells as much from the cheapest compile mode
                free = self._cheapest(free, seen.took)
            return self._light_first(free) if oom else int(self.rng.choice(free))
        log_p = (
            self._log_p_improves(np.array(rows), np.array(values), free)
            if log_p_cheap is None
            else log_p_cheap  # the cheap phase's, of these same configs: one fit a pick
        )
        if len(rows) < self.explore_first:  # a design first: what the model knows least
            log_p = self._log_spread(np.array(rows), np.array(values), free, pair_sd=0.5)
        elif self.explore_below > 0 and float(log_p.max()) < math.log(self.explore_below):
            if self.explore_by == "random":
                log_p = self.rng.uniform(-1, 0, size=len(free))  # any config that may run
            else:
                log_p = self._log_spread(np.array(rows), np.array(values), free)
        log_p += self.feasibility_weight * log_runs[free]  # P(it runs and improves)
        # (or with "ei": its expected improvement, weighed by P(it runs) the same way)
        mode = self._mode
        took = [(mode(i), s) for i, s in seen.took]
        log_seconds = search_cost.counted_log_seconds(
            [mode(i) for i in free] + [mode(rows[int(np.argmin(values))])],
            took, [mode(i) for i in rows], self.cost_after,
        )  # fmt: skip
        weight = search_cost.cooled_weight(self.cost_weight, len(rows), self.cost_cooling)
        if self.cost_explore_below > 0 and float(log_p.max()) >= math.log(self.cost_explore_below):
            weight = 0.0  # a pick expected to improve: its seconds are worth paying
        return free[
            search_cost.pick(
                log_p,
                log_seconds[:-1],
                float(log_seconds[-1]),
                weight,
                self.cost_window,
                self.cost_against,
            )
        ]

    def _cheap_first(self, free: list[int], seen: _History) -> tuple[list[int], np.ndarray | None]:
        """``free``, or while the search is learning in the cheapest compile mode
        (``cheap_first``) the configs of that mode, with their log P(improves) where the
        phase computed it (None otherwise)."""
        ran = seen.rows + seen.contended  # a contended measurement counts as run here: on a
        # machine shared throughout, the model learns nothing, and the dear modes must still run
        if self.cheap_first <= 0 or len(ran) >= self.cheap_first:
            return free, None
        cheap = self._cheapest(free, seen.took)
        modes = {self._mode(i) for i in cheap}
        if len(cheap) == len(free) or any(self._mode(i) not in modes for i in ran):
            return free, None  # one mode left, or a dearer mode measured: past it
        if not seen.rows:
            return cheap, None
        log_p = self._log_p_improves(np.array(seen.rows), np.array(seen.values), cheap)
        if float(log_p.max()) < math.log(self.cheap_first_below):
            return free, None
        return cheap, log_p

    def _history(self, trials: list[FrozenTrial]) -> _History:
        """What the trials told: the configs measured (log $/run), those that failed and how,
        their peak memory and the seconds each took."""
        seen = _History()
        for t in trials:
            if t.state != TrialState.COMPLETE or REPEAT_ATTR in t.user_attrs:
                continue
            index = self._index.get(_key(t.params))
            if index is None:
                continue
            seconds = search_cost.trial_seconds(t)
            if seconds is not None:
                seen.took.append((index, seconds))
            if infeasible(t):
                if t.user_attrs.get("failure_kind") == "oom":
                    seen.oom.append(index)
                else:  # unsupported, compile error...: a config that fails here
                    seen.failed.append(index)
                    if t.user_attrs.get("failure_kind") in _MODEL_FAILURES:
                        seen.model_failed.add(int(self._model_side[index]))
                continue
            value = self._revised.get(_key(t.params), t.value)
            if t.user_attrs.get(CONTENDED_ATTR) and _key(t.params) not in self._revised:
                seen.contended.append(index)
                continue  # slowed by other work by an unknown factor: it says little
            if value is not None and value > 0 and math.isfinite(value):
                seen.rows.append(index)
                seen.values.append(math.log(value))
            peak = t.user_attrs.get("peak_memory_bytes")
            if isinstance(peak, (int, float)) and peak > 0:
                seen.memory.append((index, math.log(peak)))
        return seen

    def _log_p_improves(self, rows: np.ndarray, y: np.ndarray, free: list[int]) -> np.ndarray:
        """log P(a free config beats the best measured log $/run by more than
        ``improvement``), under the posterior of the cost model; with ``cost_acquisition``
        "ei", log of the expected improvement below that target instead. With ``incumbent``
        "posterior", the best is the lowest posterior mean over the measured configs."""
        if self.cost_acquisition not in ("pi", "ei"):
            raise ValueError(
                f"cost_acquisition must be 'pi' or 'ei', not {self.cost_acquisition!r}"
            )
        if self.incumbent not in ("measured", "posterior"):
            raise ValueError(f"incumbent must be 'measured' or 'posterior', not {self.incumbent!r}")
        measured = self.design.matrix(rows)
        posterior = self._cost_posterior(rows, y)
        if self.incumbent == "posterior":  # (the posterior's mean is of y less its mean)
            best = float(posterior.mean(measured).min())
        else:
            best = float(y.min()) - float(y.mean())
        target = best - self.improvement
        log_pi = np.empty(len(free))
        for start in range(0, len(free), self.chunk):
            features = self.design.matrix(np.asarray(free[start : start + self.chunk]))
            mean, variance = posterior.mean(features), posterior.variance(features)
            sd = np.sqrt(np.maximum(variance, 1e-12))
            z = (target - mean) / sd
            if self.cost_acquisition == "ei":  # sd (z Φ(z) + φ(z))
                score = np.log(sd) + search_cost.log_expected_improvement(z)
            else:
                score = scipy.special.log_ndtr(z)
            log_pi[start : start + self.chunk] = score
        return log_pi

    def _cost_posterior(self, rows: np.ndarray, y: np.ndarray) -> Posterior:
        """The cost model given the measured configs' log $/run (with
        ``interaction_prior_fit``, ``expected_pairs_fit`` or ``noise_fit``, the likeliest of
        their priors and noise sds: the highest marginal likelihood)."""
        measured = self.design.matrix(rows)
        priors = [self.prior_var]
        if self.interaction_prior_fit:
            pair = np.array([k == "pair" for k in self.design.kinds])
            priors = [np.where(pair, sd**2, self.prior_var) for sd in self.interaction_prior_fit]
        elif self.expected_pairs_fit:
            priors = [
                np.where(self._expected, sd**2, self.prior_var) for sd in self.expected_pairs_fit
            ]
        fits = [
            Posterior(measured, y, prior_var, noise_sd)
            for prior_var in priors
            for noise_sd in self.noise_fit or (self.noise_sd,)
        ]
        return max(fits, key=lambda p: p.log_evidence)

    def _log_spread(
        self, rows: np.ndarray, y: np.ndarray, free: list[int], pair_sd: float | None = None
    ) -> np.ndarray:
        """log of the posterior sd of each free config's log $/run: what a pick learns (with
        ``pair_sd``, under that interaction prior: a design that covers pairs of values)."""
        if pair_sd is None:
            posterior = self._cost_posterior(rows, y)
        else:
            pair = np.array([k == "pair" for k in self.design.kinds])
            prior_var = np.where(pair, pair_sd**2, self.prior_var)
            posterior = Posterior(self.design.matrix(rows), y, prior_var, self.noise_sd)
        spread = np.empty(len(free))
        for start in range(0, len(free), self.chunk):
            features = self.design.matrix(np.asarray(free[start : start + self.chunk]))
            spread[start : start + self.chunk] = posterior.variance(features)
        return 0.5 * np.log(np.maximum(spread, 1e-12))

    def _mode(self, index: int) -> Any:
        """The compile mode of candidate ``index`` (a space listing one has no parameter)."""
        return self.candidates[index].get("compile_mode", "none")

    def _cheapest(self, free: list[int], took: list[tuple[int, float]]) -> list[int]:
        """The free configs whose trial is expected to take the fewest seconds (by compile
        mode, ``search_cost.expected_seconds``; within 1%)."""
        seconds = search_cost.expected_seconds(
            [self._mode(i) for i in free], [(self._mode(i), s) for i, s in took]
        )
        return [i for i, s in zip(free, seconds, strict=True) if s <= 1.01 * seconds.min()]

    def _light_first(self, free: list[int]) -> int:
        """After a config ran out of memory and before any has been measured: a random one
        among the lightest quarter of the free configs by tokens per step. Most of a space can
        lie past the memory wall (three in four configs of a QLoRA on a 24 GB card), and
        picks at random there ran out of memory twice on average before anything was
        measured; a light config runs, and its peak memory calibrates the memory model for
        every other config. The first pick stays random: on a space without a wall, a light
        first config (a small batch) told the model less (3 more trials to 5% on the CPU
        grid's tokens/s)."""
        tokens = self._log_tokens[free]
        light = [i for i, t in zip(free, tokens, strict=True) if t <= np.quantile(tokens, 0.25)]
        return int(self.rng.choice(light or free))

    def _fits(
        self,
        free: list[int],
        oom: list[int],
        memory: list[tuple[int, float]],
        log_runs: np.ndarray,
    ) -> list[int]:
        """The free configs a model of peak memory says fit: predicted lighter than the
        lightest config that ran out of memory is predicted (and than the heaviest that ran:
        the model may not say less). The model is physical from the first measured trial:
        peak memory grows with tokens per step (batch x sequence length), and a regression
        over the knobs learns how each value moves the memory per token (checkpointing, a
        compile mode, the fixed weights that make small steps dearer per token)."""
        if not memory:
            return free
        rows = np.array([i for i, _ in memory])
        per_token = np.array([m for _, m in memory]) - self._log_tokens[rows]
        posterior = Posterior(self.design.matrix(rows), per_token, self.per_token_prior_var, 0.05)
        offset = float(per_token.mean())

        def predicted(indexes: Sequence[int]) -> np.ndarray:
            at = np.asarray(indexes, dtype=int)
            return self.design.predict(indexes, posterior.weights) + offset + self._log_tokens[at]

        heaviest_ran = max(m for _, m in memory)
        lightest_oom = float(predicted(oom).min())
        # the device's memory lies between the two: a config predicted past the middle is
        # more likely to run out of memory than not
        limit = max(heaviest_ran + self.wall_share * (lightest_oom - heaviest_ran), heaviest_ran)
        keep = []
        for start in range(0, len(free), self.chunk):
            chunk = free[start : start + self.chunk]
            sd = np.sqrt(np.maximum(posterior.variance(self.design.matrix(np.asarray(chunk))), 0))
            mean = predicted(chunk)
            lowest = mean - self.memory_margin_sd * sd
            keep += [i for i, p in zip(chunk, lowest, strict=True) if p < limit]
            # P(it fits) by where its predicted peak lies between the two, without the
            # model's own spread: a spread-weighted P(fits) put off every config unlike the
            # measured ones (checkpointing, eager attention), held-out's best among them
            # (25 trials to 5% against 15-16 on samples/s; bench/RESULTS.md, Run 7)
            spread = np.full(len(chunk), self.memory_measurement_sd)
            fits = log_p_fits(mean, spread, heaviest_ran, lightest_oom)
            log_runs[chunk] += self.fits_weight * fits
        return keep or free

    def _unlike(
        self,
        free: list[int],
        failed: list[int],
        ran: list[int],
        log_runs: np.ndarray | None = None,
    ) -> list[int]:
        """The free configs a linear model of "failed" (1) against "ran" (0), over the same
        features, does not confidently put at even odds or worse: a config is left out when
        its posterior mean, less half its posterior sd, is at least 0.5. A config like no
        measured one keeps a wide sd and stays a candidate; a hard cut on the mean alone
        once kept a table's best configs (checkpointing at a batch that fails without it)
        out of reach for 450 trials (bench/RESULTS.md, held-out)."""
        if not ran:
            return free
        rows = np.array(failed + ran)
        label = np.array([1.0] * len(failed) + [0.0] * len(ran))
        posterior = Posterior(self.design.matrix(rows), label, self.failure_prior_var, 0.3)
        keep = []
        for start in range(0, len(free), self.chunk):
            chunk = free[start : start + self.chunk]
            features = self.design.matrix(np.asarray(chunk))
            sd = np.sqrt(np.maximum(posterior.variance(features), 0.0))
            expected = posterior.mean(features) + label.mean()
            failing = expected - self.failure_margin_sd * sd
            keep += [i for i, p in zip(chunk, failing, strict=True) if p < 0.5]
            if log_runs is not None:  # P(it runs): 1 - P(fails), a linear model's, clipped
                log_runs[chunk] += np.log(1 - np.clip(expected, 0.0, self.failure_cap))
        return keep or free

    def _posterior_mean(
        self, rows: np.ndarray, y: np.ndarray, prior_var: np.ndarray, noise_sd: float
    ) -> np.ndarray:
        """The posterior mean of the weights of y ~ features[rows] (y centered)."""
        return Posterior(self.design.matrix(rows), y, prior_var, noise_sd).weights


@dataclass
class _History:
    """The trials as ``ImprovementGridSampler`` reads them (indexes into its candidates)."""

    rows: list[int] = field(default_factory=list)  # measured, not contended
    values: list[float] = field(default_factory=list)  # their log $/run
    oom: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)  # the other failures
    model_failed: set[int] = field(default_factory=set)  # model sides that failed to run
    memory: list[tuple[int, float]] = field(default_factory=list)  # log peak memory
    took: list[tuple[int, float]] = field(default_factory=list)  # seconds per trial run
    contended: list[int] = field(default_factory=list)  # measured, but only on a shared machine


# knobs that change how batches reach the model, not what the model computes: a config that
# failed to compile (or another failure of the model's own) fails the same with any of them
_LOADER_KNOBS = frozenset(
    {"num_workers", "prefetch_factor", "persistent_workers", "multiprocessing_context",
     "pin_memory", "gradient_accumulation_steps"}
)  # fmt: skip
_MODEL_FAILURES = frozenset({"compile", "unsupported", "nonfinite"})


def runnable_params(
    configs: Iterable[Any], params_of: Callable[[Any], dict[str, Any]]
) -> list[dict[str, Any]]:
    """The distinct Optuna parameter sets of ``configs`` (configs that differ only in a knob
    with one choice are the same parameters)."""
    seen: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
    for config in configs:
        params = params_of(config)
        seen.setdefault(_key(params), params)
    return list(seen.values())
