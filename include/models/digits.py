"""A small CNN for scikit-learn's bundled 8x8 handwritten digits, and its Ray Train loop.

The staged rows hold 64 pixel columns (``p00``..``p63``, scaled to [0, 1]); the model unflattens
them into one 8x8 channel, so the shared training loop (and its ``evaluate``) feeds it like any
tabular model.
"""

from __future__ import annotations

from typing import Any

from include.training.loop import evaluate, run_epochs

__all__ = ["build_model", "evaluate", "train_loop"]


def build_model(config: dict[str, Any]):
    """Two conv blocks and a linear head over the 8x8 image."""
    from torch import nn

    channels = int(config.get("channels", 32))
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, channels, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(channels, channels, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(float(config.get("dropout", 0.1))),
        nn.Linear(channels * 16, int(config.get("num_classes", 10))),
    )


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train worker loop for the CNN (see :func:`include.training.loop.run_epochs`)."""
    run_epochs(config, build_model)
