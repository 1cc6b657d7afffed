"""Input validation for a raw partition, before anything downstream runs on it.

Two passes, cheapest first: the declared schema against the Parquet footers (no Spark needed, so a
wrong file fails in seconds), then the values (nulls, NaN and infinities in feature columns) in
one Spark aggregation. Every problem is collected, so one failure names them all.
"""

from __future__ import annotations

from typing import Any

from emr_ray.cluster import storage

_ALIASES = {
    "float64": "double",
    "float32": "float",
    "int": "int64",
    "long": "int64",
    "bigint": "int64",
    "integer": "int32",
    "str": "string",
    "utf8": "string",
}


def _canonical(type_name: str) -> str:
    name = type_name.strip().lower()
    return _ALIASES.get(name, name)


def schema_problems(
    files: list[str], declared: dict[str, str], uri: str, options: storage.StorageOptions
) -> list[str]:
    """Missing columns and wrong types, per file, against ``declared`` (column -> Arrow type name)."""
    import pyarrow.parquet as pq

    fsys = storage.filesystem(uri, options)
    problems: list[str] = []
    for path in files:
        schema = pq.read_schema(path, filesystem=fsys)
        name = path.rsplit("/", 1)[-1]
        for column, wanted in declared.items():
            if column not in schema.names:
                problems.append(f"{name}: column {column!r} is missing (expected {wanted})")
            elif _canonical(str(schema.field(column).type)) != _canonical(wanted):
                problems.append(
                    f"{name}: column {column!r} has type {schema.field(column).type}, expected {wanted}"
                )
    return problems


def count_and_check(df, columns: list[str]) -> tuple[int, list[str]]:
    """The rows of ``df`` and the nulls, NaN and infinities in ``columns``, in one Spark aggregation
    (one pass over the data, one Spark job: each costs a warm session a fixed part of a second)."""
    from pyspark.sql import functions as F

    checks = [F.count(F.lit(1)).alias("__rows")]
    for c in columns:
        bad_number = F.isnan(F.col(c)) | F.col(c).isin(float("inf"), float("-inf"))
        checks += [
            F.sum(F.col(c).isNull().cast("int")).alias(f"{c}__null"),
            F.sum(F.when(bad_number, 1).otherwise(0)).alias(f"{c}__nonfinite"),
        ]
    counts: dict[str, Any] = df.agg(*checks).first().asDict()
    problems = []
    for c in columns:
        if counts[f"{c}__null"]:
            problems.append(f"column {c!r} has {counts[f'{c}__null']} null value(s)")
        if counts[f"{c}__nonfinite"]:
            problems.append(f"column {c!r} has {counts[f'{c}__nonfinite']} NaN or infinite value(s)")
    return int(counts["__rows"]), problems
