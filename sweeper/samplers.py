"""The samplers a space file may name (``search.sampler``): names only, so that reading a space
loads no optuna, numpy or scipy; ``sweeper.search`` builds them."""

from __future__ import annotations

from typing import Literal, get_args

SamplerName = Literal["bayes", "tpe", "tpe-multivariate", "gp", "random", "grid"]
SAMPLERS: tuple[str, ...] = get_args(SamplerName)
DEFAULT_SAMPLER: SamplerName = "bayes"  # the replay benchmark's winner (bench/RESULTS.md)
