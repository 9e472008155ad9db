"""sweeper: timed training trials, priced per run, to pick the cheapest config that works."""

__version__ = "0.1.0"


# Your training program's one line (engine: script): sweeper.callback(), sweeper.step(...),
# sweeper.trial_config(). Imported on first use, so `import sweeper` stays light.
_HOOKS = ("callback", "step", "trial_config")


def __getattr__(name: str) -> object:
    if name in _HOOKS:
        from sweeper.trial import hook

        return getattr(hook, name)
    raise AttributeError(f"module 'sweeper' has no attribute {name!r}")
