"""Preprocessing for the tabular model, run by Spark on Ray: split, then standardize.

The mean and standard deviation come from the training split only, so nothing about the test
rows leaks into training. Returns named DataFrames; the job writes and commits them.
"""

from __future__ import annotations

from typing import Any


def standardize(df, config: dict[str, Any]) -> dict[str, Any]:
    """Split ``df`` into train/test (deterministic by seed) and scale features to mean 0, variance 1."""
    from pyspark.sql import functions as F

    features: list[str] = config["feature_columns"]
    label: str = config["label_column"]
    test_fraction = float(config.get("test_fraction", 0.2))
    seed = int(config.get("seed", 42))
    train, test = df.randomSplit([1.0 - test_fraction, test_fraction], seed=seed)
    aggregates = [F.mean(c).alias(f"{c}__mean") for c in features] + [
        F.stddev_pop(c).alias(f"{c}__std") for c in features
    ]
    stats = train.agg(*aggregates).first().asDict()

    def scaled(part):
        columns = []
        for c in features:
            std = stats[f"{c}__std"] or 1.0
            columns.append(((F.col(c) - F.lit(stats[f"{c}__mean"])) / F.lit(std)).cast("float").alias(c))
        return part.select(*columns, F.col(label).cast("long").alias(label))

    return {"train": scaled(train), "test": scaled(test)}
