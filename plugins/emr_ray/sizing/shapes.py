"""Cluster shapes and the table a backfill's prediction prints for them (no I/O but reading a costs file).

A shape is node groups of CPUs and GPUs (``4x16``, ``2x32,2x8:1``); :data:`EXAMPLE_SHAPES` are three
Tencent Cloud EMR examples. The costs come from a measurement: ``bench/sizing.py --measure`` writes
them (``costs``), or ``bench.pipeline``'s per-size results are fitted (:func:`load_costs`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from emr_ray.sizing.model import (
    Cluster,
    Costs,
    Nodes,
    Settings,
    assume_gpu_training,
    costs_from_sizes,
    predict,
)

#: example shapes, not recommendations: Tencent Cloud CVM instance types that EMR offers (check your
#: region's list); every node's CPUs and GPUs are Ray's to schedule, Airflow runs elsewhere
EXAMPLE_SHAPES = (
    Cluster((Nodes(1, 16, memory_gb=64, kind="S5.4XLARGE64"),), name="1 x S5.4XLARGE64 (16 vCPU)"),
    Cluster((Nodes(4, 16, memory_gb=64, kind="S5.4XLARGE64"),), name="4 x S5.4XLARGE64 (64 vCPU)"),
    Cluster(
        (
            Nodes(2, 32, memory_gb=128, kind="S5.8XLARGE128"),
            Nodes(2, 8, gpus=1, memory_gb=32, kind="GN7.2XLARGE32"),
        ),
        name="2 x S5.8XLARGE128 + 2 x GN7.2XLARGE32 (80 vCPU, 2 T4; training on 1 GPU)",
    ),
)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-markdown table (also readable on a terminal)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    return "\n".join(lines)


def shapes_table(costs: Costs, shapes: list[tuple[Cluster, Settings]], days: int, rows: list[int]) -> str:
    out = []
    for cluster, settings in shapes:
        shaped = assume_gpu_training(costs, settings.gpus_per_lane) if settings.gpus_per_lane else costs
        for n in rows:
            p = predict(shaped, cluster, settings, partitions=days, rows=n)
            out.append(
                [
                    cluster.describe(),
                    f"{n:,}",
                    f"{p.pool_slots}",
                    p.bottleneck,
                    _hours(p.wall_s),
                    f"{p.partitions_per_hour:.0f}",
                    f"{p.jobs_cpu_hours:.1f} / {p.cluster_cpu_hours:.0f}",
                    f"{p.jobs_gpu_hours:.1f} / {p.cluster_gpu_hours:.0f}" if p.cluster_gpus else "-",
                    f"{p.cpu_utilisation:.0%}" + (f" / {p.gpu_utilisation:.0%}" if p.cluster_gpus else ""),
                ]
            )
    headers = [
        "EMR shape (example)",
        "rows per partition",
        "Ray pool slots",
        "bottleneck",
        f"{days} days",
        "partitions/h",
        "CPU-h jobs / cluster",
        "GPU-h jobs / cluster",
        "utilisation CPU / GPU",
    ]
    return table(headers, out)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def shapes_for(specs: list[str], examples: bool) -> list[tuple[Cluster, Settings]]:
    shapes = list(EXAMPLE_SHAPES) if examples else []
    shapes += [parse_shape(spec) for spec in specs]
    return [(c, Settings(gpus_per_lane=1.0 if c.gpus else 0.0)) for c in shapes]


def parse_shape(spec: str) -> Cluster:
    """``4x16`` (4 nodes of 16 CPUs) or ``2x32,2x8:1`` (and 2 nodes of 8 CPUs and 1 GPU each)."""
    groups = []
    for group in spec.split(","):
        try:
            count, rest = group.strip().lower().split("x", 1)
            cpus, _, gpus = rest.partition(":")
            groups.append(Nodes(int(count), float(cpus), float(gpus or 0)))
        except ValueError as e:
            if "per node" in str(e) or "nodes of" in str(e):
                raise
            raise ValueError(
                f"--shape {spec!r}: write node groups as COUNTxCPUS[:GPUS], e.g. 4x16 or 2x32,2x8:1"
            ) from e
    return Cluster(tuple(groups))


def load_costs(path: Path, contender: str) -> Costs:
    """Costs from a results JSON: this script's (``costs``), or ``bench.pipeline``'s (its sizes, fitted)."""
    data = json.loads(path.read_text())
    if "costs" in data:
        return Costs.from_dict(data["costs"])
    contenders = data.get("contenders") or {}
    name = contender if contender in contenders else next(iter(contenders), None)
    if not name or len(contenders[name].get("sizes", [])) < 2:
        raise ValueError(f"{path} has no costs and no contender with two sizes: measure with --measure")
    when = data.get("machine", {}).get("when", "?")
    return costs_from_sizes(contenders[name]["sizes"], source=f"{path.name}, {name}, measured {when}")
