"""A small MLP for the tabular partition, its Ray Train loop (runs on Ray Train workers) and its evaluation."""

from __future__ import annotations

from typing import Any

from include.training.loop import evaluate, run_epochs

__all__ = ["build_model", "evaluate", "train_loop"]


def build_model(config: dict[str, Any]):
    """The model, from the loop's config (the job rebuilds it to log the trained weights).

    With ``train_loop`` and ``evaluate`` this module follows :class:`emr_ray.cluster.train.EvaluatingModule`.
    """
    from torch import nn

    width = int(config.get("hidden", 64))
    return nn.Sequential(
        nn.Linear(len(config["feature_columns"]), width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, int(config.get("num_classes", 2))),
    )


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train worker loop for the MLP (see :func:`include.training.loop.run_epochs`)."""
    run_epochs(config, build_model)
