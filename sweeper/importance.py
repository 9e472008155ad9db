"""Which knobs matter: Optuna's parameter-importance evaluators over a study's completed trials.

The trials are read from our table (not Optuna's), so the target can be any measured column —
$/run (the objective) by default, or samples/s — and the search space comes from the study's
stored space file. Knobs with a single choice, or that never varied, have no importance and
are left out. The API caches results per study version (api/cache.py)::

    importances(store, "cpu-demo")            # [KnobImportance(knob="max_seq_length", ...), ...]
    importances(store, "cpu-demo", target="samples_per_s", evaluator="fanova")

PED-ANOVA is the default: it is what optuna-dashboard uses, and on 8,500 completed trials of 7
categorical knobs it took 0.27 s on this 2-core VM where fANOVA (a random forest, needs
scikit-learn) took 18 s (46 s inside the loaded dashboard benchmark).
"""

from __future__ import annotations

import math
from typing import Literal

import optuna
from pydantic import BaseModel, Field

from sweeper.errors import ConflictError, NoResultError, SpaceError
from sweeper.measurement import METRICS
from sweeper.space import TrialConfig, optuna_params, parse_space
from sweeper.store import Store

Target = Literal["cost_per_run_usd", "hours_per_run", "samples_per_s", "tokens_per_s"]
Evaluator = Literal["fanova", "ped_anova"]


class KnobImportance(BaseModel):
    """One knob's share of the target's variation explained (shares sum to 1)."""

    knob: str
    importance: float = Field(ge=0, le=1)


def importances(
    store: Store,
    study: str,
    *,
    target: Target = "cost_per_run_usd",
    evaluator: Evaluator = "ped_anova",
) -> list[KnobImportance]:
    """Knobs by importance for ``target``, most important first.

    Raises NoResultError when fewer than two completed trials differ in some knob.
    """
    row = store.get_study(study)
    trials = [
        t
        for t in store.trial_metrics(study, states=["complete"])
        if isinstance(getattr(t, target), float) and math.isfinite(getattr(t, target))
    ]
    try:
        search = parse_space(row.space_yaml, f"the stored space of study {study!r}").search
    except SpaceError as e:
        raise ConflictError(f"cannot compute importance without the study's space: {e}") from e
    # every knob of a config is a categorical of the space (None: derived, not searched)
    distributions = {knob: getattr(search, knob) for knob in TrialConfig.model_fields}
    frozen = []
    for trial in trials:
        params = optuna_params(TrialConfig.model_validate(trial.config), search)
        known = {k: v for k, v in params.items() if v in (distributions.get(k) or [])}
        frozen.append(
            optuna.trial.create_trial(
                params=known,
                distributions={
                    k: optuna.distributions.CategoricalDistribution(distributions[k] or [])
                    for k in known
                },
                value=float(getattr(trial, target)),
            )
        )
    varied = [
        knob
        for knob in distributions
        if len({repr(t.params.get(knob)) for t in frozen if knob in t.params}) > 1
        and all(knob in t.params for t in frozen)
    ]
    if len(frozen) < 2 or not varied:
        raise NoResultError(
            f"study {study!r} has {len(frozen)} completed trial(s) with a {target}; importance "
            "needs at least two that differ in some knob"
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created" line per call
    direction: Literal["maximize", "minimize"] = (
        "maximize" if METRICS[target].better == "higher" else "minimize"
    )
    memory = optuna.create_study(direction=direction)
    memory.add_trials(frozen)
    chosen = (
        optuna.importance.FanovaImportanceEvaluator(seed=0)
        if evaluator == "fanova"
        else optuna.importance.PedAnovaImportanceEvaluator()
    )
    shares = optuna.importance.get_param_importances(memory, evaluator=chosen, params=varied)
    return [
        KnobImportance(knob=knob, importance=min(1.0, max(0.0, share)))
        for knob, share in sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
