"""sweeper: timed training trials, priced per run, to pick the cheapest config that works."""

__version__ = "0.1.0"
