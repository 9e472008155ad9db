"""The child side of a trial: the only place torch, transformers, datasets and tokenizers load.

The parent (``sweeper.launcher``) starts ``python -m sweeper.trial REQUEST RESULT`` in its own
process group; the child writes one JSON result — a measurement or a classified failure.
Modules here import torch lazily too, so ``sweeper.trial.protocol`` stays light for the parent.
"""
