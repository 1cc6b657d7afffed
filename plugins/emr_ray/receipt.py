"""A model version's receipt: what it was trained on, with which code, and what it cost (Airflow side).

``MLflowRegisterOperator`` writes it as ``receipt.*`` tags on each new model version, from what its
upstream tasks returned (the Ray operators' results: ``usage``, the code version the cluster ran, the
library versions, the training's input fingerprint) and an optional price table, so a version can be
audited months later without the Airflow run that made it:

- ``receipt.tasks``: per upstream task, its wall seconds, CPU- and GPU-seconds reserved and its share
  of warm pools' idle time (JSON); ``receipt.cpu_seconds`` / ``receipt.gpu_seconds``: their sums;
- ``receipt.cost`` and ``receipt.currency``: those seconds priced by the ``emr_ray_prices`` Variable
  (``{"cpu_hour": 0.048, "gpu_hour": 2.9, "currency": "USD"}``); no Variable, no cost tags;
- ``receipt.code_version``: the provider's cluster side as the job ran it
  (:func:`emr_ray.cluster.reuse.code_version`); ``receipt.versions``: Python, Ray, Spark, torch...;
- ``receipt.inputs``: the training's input fingerprint (each input's generation and the digest of its
  files' checksums), the one its checkpoints carry;
- ``receipt.raw_input``: the raw partition's identity the preprocessing read (its listing's names,
  sizes, ETags and times), by which a duplicate arrival of the same data is recognised
  (:mod:`emr_ray.arrivals`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from emr_ray.cluster.results import JobResult, SparkResult, TrainResult

PREFIX = "receipt."
#: the Airflow Variable with the price table (JSON)
PRICES_VARIABLE = "emr_ray_prices"


def tags(results: Mapping[str, Any], prices: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The receipt tags of a version from its upstream tasks' ``results`` (task id -> return value)."""
    out: dict[str, str] = {}
    tasks = {task_id: figures for task_id, result in sorted(results.items()) if (figures := _figures(result))}
    if tasks:
        cpu = sum(t["cpu_seconds"] + t["pool_idle_cpu_seconds"] for t in tasks.values())
        gpu = sum(t["gpu_seconds"] + t["pool_idle_gpu_seconds"] for t in tasks.values())
        out[PREFIX + "tasks"] = json.dumps(tasks, sort_keys=True)
        out[PREFIX + "cpu_seconds"] = f"{cpu:.1f}"
        out[PREFIX + "gpu_seconds"] = f"{gpu:.1f}"
        if (cost := priced(cpu, gpu, prices)) is not None:
            out[PREFIX + "cost"], out[PREFIX + "currency"] = f"{cost[0]:.4f}", cost[1]
    for raw in results.values():
        job = JobResult.read(raw)
        if job is None:
            continue
        if job.code_version:
            out[PREFIX + "code_version"] = job.code_version
        if isinstance(job.versions, Mapping):
            out[PREFIX + "versions"] = " ".join(f"{k}={v}" for k, v in sorted(job.versions.items()))
        if (trained := TrainResult.read(raw)) and trained.inputs_fingerprint:
            out[PREFIX + "inputs"] = trained.inputs_fingerprint
        if (preprocessed := SparkResult.read(raw)) and preprocessed.raw_input:
            out[PREFIX + "raw_input"] = preprocessed.raw_input
    return out


def priced(
    cpu_seconds: float, gpu_seconds: float, prices: Mapping[str, Any] | None
) -> tuple[float, str] | None:
    """What the seconds cost by the price table, with its currency; None without a usable table."""
    if not prices:
        return None
    try:
        cost = cpu_seconds / 3600 * float(prices.get("cpu_hour", 0)) + gpu_seconds / 3600 * float(
            prices.get("gpu_hour", 0)
        )
    except (TypeError, ValueError):
        return None
    return cost, str(prices.get("currency") or "")


def parse_prices(raw: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The price table from the Variable's text, or None and why it cannot be used."""
    if not raw:
        return None, None
    try:
        table = json.loads(raw)
    except ValueError as e:
        return None, f"the {PRICES_VARIABLE} Variable is not JSON ({e}); no cost is recorded"
    if not isinstance(table, dict) or not {"cpu_hour", "gpu_hour"} & set(table):
        return None, (
            f'the {PRICES_VARIABLE} Variable needs "cpu_hour" and/or "gpu_hour" (money per hour), e.g. '
            '{"cpu_hour": 0.048, "gpu_hour": 2.9, "currency": "USD"}; no cost is recorded'
        )
    return table, None


def _figures(result: Any) -> dict[str, float] | None:
    job = JobResult.read(result)
    usage = job.usage if job else None
    if usage is None or not usage.measured:
        return None
    idle = usage.pool_idle
    return {
        "wall_seconds": float(usage.wall_seconds or 0.0),
        "cpu_seconds": float(usage.cpu_seconds_reserved or 0.0),
        "gpu_seconds": float(usage.gpu_seconds_reserved or 0.0),
        "pool_idle_cpu_seconds": float(idle.cpu_seconds if idle else 0.0),
        "pool_idle_gpu_seconds": float(idle.gpu_seconds if idle else 0.0),
    }
