"""Preprocessing for the digits CNN, run by Spark on Ray: scale, split, and augment the training split.

Augmentation shifts each training image by one pixel in four directions (with zero fill), which
multiplies the training rows by five; the test split is left as it is.
"""

from __future__ import annotations

from typing import Any

SIDE = 8
PIXELS = [f"p{i:02d}" for i in range(SIDE * SIDE)]


def _shifted(df, label: str, dr: int, dc: int):
    """The images moved by (dr, dc) pixels, as column expressions (no Python UDF)."""
    from pyspark.sql import functions as F

    columns = []
    for r in range(SIDE):
        for c in range(SIDE):
            sr, sc = r - dr, c - dc
            inside = 0 <= sr < SIDE and 0 <= sc < SIDE
            source = F.col(PIXELS[sr * SIDE + sc]) if inside else F.lit(0.0)
            columns.append(source.cast("float").alias(PIXELS[r * SIDE + c]))
    return df.select(*columns, F.col(label))


def augment(df, config: dict[str, Any]) -> dict[str, Any]:
    """Scale pixels to [0, 1], split train/test by seed, add one-pixel shifts of the training images."""
    from pyspark.sql import functions as F

    label = config.get("label_column", "label")
    scale = float(config.get("pixel_max", 16.0))
    scaled = df.select(
        *[(F.col(p) / scale).cast("float").alias(p) for p in PIXELS], F.col(label).cast("long")
    )
    train, test = scaled.randomSplit(
        [1.0 - float(config.get("test_fraction", 0.2)), float(config.get("test_fraction", 0.2))],
        seed=int(config.get("seed", 42)),
    )
    shifts = [(0, 1), (0, -1), (1, 0), (-1, 0)] if config.get("augment", True) else []
    augmented = train
    for dr, dc in shifts:
        augmented = augmented.unionByName(_shifted(train, label, dr, dc))
    return {"train": augmented, "test": test}
