"""What one pipeline run asks of the Ray cluster, phase by phase: the arithmetic of the cluster check.

:class:`RunRequest` adds up training (workers x resources per worker) and Spark (executors x cores
and memory), plus the job drivers, and takes the larger phase per resource, since the Spark job
stops Spark before training starts. :class:`emr_ray.operators.ray.RayConnectOperator` compares the
result with the cluster's total, and each unit that runs in one process (a training worker, a Spark
executor, a job driver) with each node (:meth:`RunRequest.unplaceable`): a worker that fits no single
node waits forever however large the total. It names every shortfall with its fix.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from emr_ray.cluster.spec import worker_resources

_MEMORY_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_memory(value: float | str | None) -> float:
    """Bytes from ``"1g"``, ``"512m"``, ``"2GiB"`` or a number of bytes (RayDP's reading)."""
    if value is None or value == "":
        return 0.0
    if isinstance(value, int | float):
        return float(value)
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(i?b)?\s*", str(value), re.IGNORECASE)
    if not match:
        raise ValueError(f"memory {value!r}: write it like '1g', '512m' or a number of bytes.")
    return float(match.group(1)) * _MEMORY_UNITS[match.group(2).upper()]


def _amount(resource: str, value: float) -> str:
    if resource == "memory":
        return f"{value / 1024**3:g} GiB memory"
    return f"{value:g} {resource}"


@dataclass(frozen=True)
class RunRequest:
    """What one pipeline run asks of the cluster, phase by phase.

    - Training: ``workers`` x the per-worker resources
      (:func:`emr_ray.cluster.spec.worker_resources`, Ray Train's rule), plus the job driver's
      ``driver_cpus``.
    - Spark: ``spark_executors`` x (``spark_executor_cores`` CPUs and ``spark_executor_memory``),
      plus the job driver's ``driver_cpus``.

    The Spark job stops Spark before the training job starts, so the run needs, for each resource,
    the larger of the two phases (:meth:`peak`), not their sum.
    """

    workers: int = 0
    resources_per_worker: Mapping[str, float] | None = None
    use_gpu: bool = False
    spark_executors: int = 0
    spark_executor_cores: float = 1.0
    spark_executor_memory: float = 0.0
    driver_cpus: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "workers",
            "spark_executors",
            "spark_executor_cores",
            "spark_executor_memory",
            "driver_cpus",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: use 0 or more.")

    @property
    def per_worker(self) -> dict[str, float]:
        return worker_resources(self.resources_per_worker, self.use_gpu)

    def training(self) -> dict[str, float]:
        if not self.workers:
            return {}
        asks = {k: v * self.workers for k, v in self.per_worker.items()}
        if self.driver_cpus:
            asks["CPU"] = asks.get("CPU", 0.0) + self.driver_cpus
        return asks

    def spark(self) -> dict[str, float]:
        if not self.spark_executors:
            return {}
        asks = {"CPU": self.spark_executors * self.spark_executor_cores + self.driver_cpus}
        if self.spark_executor_memory:
            asks["memory"] = self.spark_executors * self.spark_executor_memory
        return asks

    def peak(self) -> dict[str, float]:
        training, spark = self.training(), self.spark()
        return {k: max(training.get(k, 0.0), spark.get(k, 0.0)) for k in sorted({*training, *spark})}

    def units(self) -> dict[str, dict[str, float]]:
        """What must fit on one node, each with the fix when none can hold it."""
        out: dict[str, dict[str, float]] = {}
        if self.workers:
            out["training worker"] = dict(self.per_worker)
        if self.spark_executors:
            executor = {"CPU": self.spark_executor_cores}
            if self.spark_executor_memory:
                executor["memory"] = self.spark_executor_memory
            out["Spark executor"] = executor
        if self.driver_cpus:
            out["job driver"] = {"CPU": self.driver_cpus}
        return {what: {k: v for k, v in needs.items() if v > 0} for what, needs in out.items()}

    def unplaceable(self, nodes: Sequence[Mapping[str, float]]) -> list[str]:
        """One line per unit (:meth:`units`) that no single node of ``nodes`` (each node's total
        resources) can hold, whatever the cluster's total: Ray never splits a worker across nodes."""
        fixes = {
            "training worker": "lower resources_per_worker",
            "Spark executor": "lower executor_cores or executor_memory",
            "job driver": "lower driver_cpus",
        }
        lines = []
        for what, needs in self.units().items():
            if not needs or any(all(float(n.get(k, 0.0)) >= v for k, v in needs.items()) for n in nodes):
                continue
            largest = {k: max((float(n.get(k, 0.0)) for n in nodes), default=0.0) for k in needs}
            lines.append(
                f"a {what} needs {', '.join(_amount(k, v) for k, v in needs.items())} on one node; the "
                f"{len(nodes)} node(s) have at most {', '.join(_amount(k, v) for k, v in largest.items())} "
                f"each (not necessarily on the same node): add a node that size or {fixes[what]}"
            )
        return lines

    def explain(self, resource: str, have: float) -> str:
        """Why the run needs more of ``resource`` than the cluster's ``have``, and what to change."""
        training, spark = self.training().get(resource, 0.0), self.spark().get(resource, 0.0)
        driver = (
            f" + {self.driver_cpus:g} for the job driver" if self.driver_cpus and resource == "CPU" else ""
        )
        parts = []
        if training:
            per = self.per_worker.get(resource, 0.0)
            parts.append(
                f"training asks {self.workers} worker(s) x {_amount(resource, per)}{driver} = {_amount(resource, training)}"
            )
        if spark:
            each = self.spark_executor_cores if resource == "CPU" else self.spark_executor_memory
            unit = "core(s)" if resource == "CPU" else "memory"
            each_text = f"{each:g} {unit}" if resource == "CPU" else _amount(resource, each)
            parts.append(
                f"Spark asks {self.spark_executors} executor(s) x {each_text}{driver} = {_amount(resource, spark)}"
            )
        fixes = []
        if training > have:
            fixes.append("lower num_workers or resources_per_worker")
        if spark > have:
            fixes.append("lower num_executors, executor_cores or executor_memory")
        if training and spark:
            parts.append(
                f"Spark stops before training, so the run needs the larger: {_amount(resource, max(training, spark))}"
            )
        return (
            f"{resource}: " + "; ".join(parts) + f"; the cluster has {_amount(resource, have)} in total: "
            "add nodes or " + " and ".join(fixes)
        )


def mapping_of(value: Any) -> dict[str, float] | None:
    """A dict from a dict or a rendered template (``"{'CPU': 1}"``); None for nothing."""
    if value is None or value == "" or value == "None":
        return None
    if isinstance(value, str):
        value = ast.literal_eval(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r}: give a mapping of resource name to amount, e.g. {{'CPU': 1}}.")
    return {str(k): float(v) for k, v in value.items()}


def number_of(value: Any, default: float = 0.0) -> float:
    return default if value is None or value == "" or value == "None" else float(value)
