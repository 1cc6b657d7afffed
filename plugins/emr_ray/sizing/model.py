"""What a backfill of the retraining DAG will take on a cluster (issue 35): its wall time, partitions per
hour, reserved CPU- and GPU-hours, its bottleneck and the utilisation, from measured per-task costs and
a cluster shape. Pure: no I/O, no Ray, no Airflow. ``python -m emr_ray.sizing`` prints its table for
cluster shapes; ``bench/sizing.py`` measures the costs and checks the predictions against real backfills.

**The rule.** A backfill is a pipeline: every partition passes through the same resources (Airflow's
active runs and worker slots, each Ray pool's slots, each lane's warm replica, the promotion pool, the
cluster's CPUs and GPUs, and the machine's cores where Airflow and Ray share one), and a resource with
``k`` units that a partition holds for ``s`` seconds lets one partition through every ``s / k``
seconds. The slowest resource, the bottleneck, sets the period ``P``; ``N`` partitions take one
partition's latency ``L`` (its tasks end to end, nothing queued) plus ``(N - 1) x P``, and the jobs
reserve ``N x`` their CPU- and GPU-seconds per partition.

No constant here is a guess. Each cost is ``fixed + per_1m x rows / 1e6``, fitted over partition sizes
(:func:`costs_from_sizes`, from ``bench.pipeline``'s per-size measurements); a fit that falls with rows
is the noise of close sizes, counted flat at the mean. Two figures that ``airflow dags test`` cannot
show come from a short backfill through a live Airflow (:func:`calibrate`): Airflow's gaps between a
partition's tasks, and the machine's CPU-seconds per partition when Airflow and Ray share its cores.
The lanes and pool slots are the provider's own rule, kept here (:func:`ray_pool_slots`).

Not modelled: memory (the DAG's jobs reserve about 1 GiB per lane, its Spark executor, far below what
a node offers per CPU), warm replicas started during the backfill (a busy replica's next job waits for
it rather than start another, unless the wait would outlast the start), retries and failures.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from emr_ray.params import MAX_ACTIVE_RUNS

#: CPUs one Ray job of the example DAGs needs when it starts its own Spark or worker group (the cold
#: path): a preprocessing job's executor core plus the free CPU its COS read needs, or a training
#: job's two 1-CPU workers (the default)
CPUS_PER_RAY_TASK = 2
#: CPUs of one "lane" of the example DAGs' warm pools: a Spark session's executor and a 2-worker group
CPUS_PER_WARM_LANE = 3
#: slots of each Ray pool per warm lane: one task's job in the lane's replica, one waiting at it
WARM_SLOTS_PER_LANE = 2


def ray_pool_slots(
    num_cpus: float,
    num_gpus: float = 0,
    *,
    warm: bool = True,
    gpus_per_lane: float = 0,
    warm_slots_per_lane: int = WARM_SLOTS_PER_LANE,
) -> int:
    """Slots of each Ray pool (``ray_spark`` and ``ray_train``), never 0.

    A lane is one Spark job and one training running whole side by side: :data:`CPUS_PER_WARM_LANE`
    with the warm pools (the DAGs' default), two :data:`CPUS_PER_RAY_TASK` when each job starts its
    own Spark or worker group (``warm=False``), and ``gpus_per_lane`` GPUs for GPU training.

    - Warm: two slots per lane. One task's job runs in the lane's Spark session (or worker group)
      while the next task starts, submits and waits at that replica (``emr_ray.cluster.warm.lease.serve``),
      so Airflow's seconds per task (a process, the DAG's parse, the submission, the resume after
      deferral) overlap the running job instead of adding to it; the replica runs one job at a time.
    - Cold: one slot per lane, so every job finds its whole request free: a second cold job would
      start its own Spark or group and hold part of the CPUs the first one needs.
    - A cluster smaller than one lane gets one slot of each: a training's workers start as one
      placement group, so it waits in Ray for the Spark job's CPUs and never holds part of them.
    """
    lanes = int(num_cpus // (CPUS_PER_WARM_LANE if warm else 2 * CPUS_PER_RAY_TASK))
    if gpus_per_lane:
        lanes = min(lanes, int(num_gpus // gpus_per_lane))
    return warm_slots_per_lane * lanes if warm and lanes else max(1, lanes)


#: the DAG's Ray tasks, each in its own pool and lane; the other tasks run in Airflow alone
RAY_TASKS = ("preprocess", "train")
#: the task that takes the promotion pool's slot (one promotion at a time)
PROMOTION_TASK = "register"
#: ``[core] parallelism``: Airflow's task slots when a deployment does not set it
AIRFLOW_DEFAULT_PARALLELISM = 32


# -- inputs -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    """A cost that grows with the partition: ``fixed + per_1m x rows / 1e6``, never below zero."""

    fixed: float
    per_1m: float = 0.0

    def at(self, rows: float) -> float:
        return max(self.fixed + self.per_1m * rows / 1e6, 0.0)

    def __add__(self, other: Line) -> Line:
        return Line(self.fixed + other.fixed, self.per_1m + other.per_1m)


ZERO = Line(0.0)


@dataclass(frozen=True)
class RayTaskCost:
    """One Ray task of a partition: the task instance's seconds (Airflow's start and finish, the
    submission, the job), its Ray job's wall (what it holds its lane's replica for), and the CPU- and
    GPU-seconds the job reserved (its ``usage``)."""

    task: Line
    job: Line
    cpu_s: Line
    gpu_s: Line = ZERO


@dataclass(frozen=True)
class Costs:
    """What one partition costs, measured (:func:`costs_from_sizes`, :func:`calibrate`).

    :param airflow_tasks: seconds of each task that runs in Airflow alone (sensor, cluster check,
        short-circuit, registration), by task id.
    :param gaps: Airflow's seconds between a partition's tasks, all together (scheduling, task start).
    :param host_cpu_s: CPU-seconds that every process (Airflow's and Ray's) used per partition on a
        machine that runs both; None when not measured.
    """

    preprocess: RayTaskCost
    train: RayTaskCost
    airflow_tasks: Mapping[str, Line]
    gaps: Line = ZERO
    host_cpu_s: Line | None = None
    source: str = ""

    def latency_s(self, rows: float) -> float:
        """One partition's tasks end to end, nothing queued: every task, one after the other, and the gaps."""
        tasks = self.preprocess.task.at(rows) + self.train.task.at(rows)
        return tasks + sum(line.at(rows) for line in self.airflow_tasks.values()) + self.gaps.at(rows)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Costs:
        def ray(part: Mapping[str, Any]) -> RayTaskCost:
            return RayTaskCost(**{k: Line(**v) for k, v in part.items()})

        host = data.get("host_cpu_s")
        return cls(
            preprocess=ray(data["preprocess"]),
            train=ray(data["train"]),
            airflow_tasks={k: Line(**v) for k, v in data["airflow_tasks"].items()},
            gaps=Line(**data.get("gaps", {"fixed": 0.0})),
            host_cpu_s=Line(**host) if host else None,
            source=str(data.get("source", "")),
        )


@dataclass(frozen=True)
class Nodes:
    """``count`` nodes of one kind: the CPUs and GPUs Ray schedules on each."""

    count: int
    cpus: float
    gpus: float = 0.0
    memory_gb: float | None = None
    kind: str = ""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(
                f"count={self.count} nodes of {self.kind or 'a kind'}: give at least 1, or leave the kind out."
            )
        if self.cpus <= 0:
            raise ValueError(
                f"cpus={self.cpus} per node of {self.kind or 'a kind'}: a Ray node needs at least one CPU; "
                "give the CPUs Ray schedules on each node (its --num-cpus, the instance's vCPUs by default)."
            )
        if self.gpus < 0:
            raise ValueError(f"gpus={self.gpus} per node of {self.kind or 'a kind'}: give 0 or more.")


@dataclass(frozen=True)
class Cluster:
    """A Ray cluster's shape; ``host_cores``: the cores of the one machine that runs Airflow and this
    cluster together (a local stack), None when Airflow runs elsewhere."""

    nodes: tuple[Nodes, ...]
    host_cores: float | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError(
                "a cluster with no nodes: give at least one, e.g. Cluster((Nodes(count=1, cpus=16),))."
            )
        if self.host_cores is not None and self.host_cores <= 0:
            raise ValueError(
                f"host_cores={self.host_cores}: give the cores Airflow and Ray share (more than 0), "
                "or None when Airflow runs on machines of its own."
            )

    @property
    def cpus(self) -> float:
        return sum(n.count * n.cpus for n in self.nodes)

    @property
    def gpus(self) -> float:
        return sum(n.count * n.gpus for n in self.nodes)

    def describe(self) -> str:
        groups = " + ".join(
            f"{n.count} x {n.cpus:g} CPU" + (f", {n.gpus:g} GPU" if n.gpus else "") for n in self.nodes
        )
        return self.name or groups


@dataclass(frozen=True)
class Settings:
    """The DAG's and the deployment's concurrency.

    :param max_active_runs: the DAG's runs at once (the DAGs' :data:`emr_ray.params.MAX_ACTIVE_RUNS`).
    :param airflow_slots: Airflow's task slots (``[core] parallelism``); a deferred task holds none.
    :param warm: the warm pools (the DAGs' default): two pool slots per lane, one job at a time in each
        lane's replica; False: every job starts its own Spark or worker group, one slot per lane.
    :param gpus_per_lane: GPUs one training takes (0: it trains on CPUs).
    :param pool_slots: slots of each Ray pool; None: :func:`ray_pool_slots` of the cluster.
    :param promotion_slots: slots of the promotion pool (one: promotions never interleave).
    """

    max_active_runs: int = MAX_ACTIVE_RUNS
    airflow_slots: int = AIRFLOW_DEFAULT_PARALLELISM
    warm: bool = True
    gpus_per_lane: float = 0.0
    pool_slots: int | None = None
    promotion_slots: int = 1

    def __post_init__(self) -> None:
        for name in ("max_active_runs", "airflow_slots", "promotion_slots"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"{name}={getattr(self, name)}: give at least 1 (Airflow runs nothing with 0)."
                )
        if self.pool_slots is not None and self.pool_slots < 1:
            raise ValueError(
                f"pool_slots={self.pool_slots}: give at least 1, or None to size the pools from the cluster."
            )

    def slots(self, cluster: Cluster) -> int:
        """Slots of each Ray pool: the provider's rule, one copy (:func:`ray_pool_slots`)."""
        if self.pool_slots is not None:
            return self.pool_slots
        return ray_pool_slots(cluster.cpus, cluster.gpus, warm=self.warm, gpus_per_lane=self.gpus_per_lane)

    def replicas(self, cluster: Cluster) -> int:
        """Jobs of one kind that run at once: a warm lane's replica runs one job (its second slot waits
        at it); a cold job starts its own Spark or group, one per slot."""
        slots = self.slots(cluster)
        return max(1, slots // 2) if self.warm else slots


# -- the model --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    """A backfill's predicted figures; ``periods``: each resource's seconds per partition (the largest
    is the bottleneck's, the period), ``busy``: the share of the backfill's steady state each is busy."""

    cluster: str
    partitions: int
    rows: int
    wall_s: float
    period_s: float
    latency_s: float
    bottleneck: str
    periods: dict[str, float]
    pool_slots: int
    replicas: int
    cluster_cpus: float
    cluster_gpus: float
    jobs_cpu_hours: float
    jobs_gpu_hours: float
    cluster_cpu_hours: float
    cluster_gpu_hours: float
    host_cpu_hours: float | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def partitions_per_hour(self) -> float:
        return 3600 * self.partitions / self.wall_s

    @property
    def steady_partitions_per_hour(self) -> float:
        return 3600 / self.period_s

    @property
    def cpu_utilisation(self) -> float:
        """The jobs' reserved CPU-seconds over the cluster's CPUs x the wall (``bench.pipeline``'s figure)."""
        return self.jobs_cpu_hours / self.cluster_cpu_hours if self.cluster_cpu_hours else 0.0

    @property
    def gpu_utilisation(self) -> float:
        return self.jobs_gpu_hours / self.cluster_gpu_hours if self.cluster_gpu_hours else 0.0

    @property
    def busy(self) -> dict[str, float]:
        return {name: round(seconds / self.period_s, 3) for name, seconds in self.periods.items()}

    def to_dict(self) -> dict[str, Any]:
        out = {k: round(v, 4) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}
        out |= {
            "partitions_per_hour": round(self.partitions_per_hour, 2),
            "steady_partitions_per_hour": round(self.steady_partitions_per_hour, 2),
            "cpu_utilisation": round(self.cpu_utilisation, 3),
            "gpu_utilisation": round(self.gpu_utilisation, 3),
            "busy": self.busy,
        }
        return out

    def explain(self) -> str:
        """The prediction in a few lines: the rule's terms with their values."""
        ranked = sorted(self.periods.items(), key=lambda kv: -kv[1])
        lines = [
            f"{self.cluster}: {self.partitions} partitions x {self.rows:,} rows -> {_duration(self.wall_s)} "
            f"({self.partitions_per_hour:.1f} partitions/h)",
            f"- latency {self.latency_s:.1f} s + ({self.partitions} - 1) x period {self.period_s:.1f} s; "
            f"bottleneck: {self.bottleneck}",
            "- seconds per partition of each resource: "
            + ", ".join(f"{name} {seconds:.2f}" for name, seconds in ranked),
            f"- Ray pools {self.pool_slots} slot(s) each, {self.replicas} replica(s) per kind; reserved by the "
            f"jobs {self.jobs_cpu_hours:.2f} CPU-h, {self.jobs_gpu_hours:.2f} GPU-h of the cluster's "
            f"{self.cluster_cpu_hours:.2f} CPU-h, {self.cluster_gpu_hours:.2f} GPU-h "
            f"(utilisation {self.cpu_utilisation:.0%} CPU"
            + (f", {self.gpu_utilisation:.0%} GPU" if self.cluster_gpus else "")
            + ")",
        ]
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)


def periods(costs: Costs, cluster: Cluster, settings: Settings, rows: float) -> dict[str, float]:
    """Each resource's seconds per partition: what a partition holds of it over how many it has."""
    pre, train = costs.preprocess, costs.train
    slots, replicas = settings.slots(cluster), settings.replicas(cluster)
    airflow_side = sum(line.at(rows) for line in costs.airflow_tasks.values()) + sum(
        t.task.at(rows) - t.job.at(rows) for t in (pre, train)
    )
    out = {
        "active runs": costs.latency_s(rows) / settings.max_active_runs,
        "Airflow task slots": airflow_side / settings.airflow_slots,
        "ray_spark pool": pre.task.at(rows) / slots,
        "Spark replicas": pre.job.at(rows) / replicas,
        "ray_train pool": train.task.at(rows) / slots,
        "training replicas": train.job.at(rows) / replicas,
        "promotion pool": costs.airflow_tasks.get(PROMOTION_TASK, ZERO).at(rows) / settings.promotion_slots,
        "cluster CPUs": (pre.cpu_s.at(rows) + train.cpu_s.at(rows)) / cluster.cpus,
    }
    gpu_s = pre.gpu_s.at(rows) + train.gpu_s.at(rows)
    if gpu_s and not cluster.gpus:
        raise ValueError(
            f"the measured jobs reserve {gpu_s:.1f} GPU-seconds per partition but {cluster.describe()} has no "
            "GPUs: give the GPU nodes (Nodes(..., gpus=1)) or costs measured with CPU training."
        )
    if cluster.gpus:
        out["cluster GPUs"] = gpu_s / cluster.gpus
    if cluster.host_cores and costs.host_cpu_s is not None:
        out["host cores"] = costs.host_cpu_s.at(rows) / cluster.host_cores
    return out


def predict(costs: Costs, cluster: Cluster, settings: Settings, *, partitions: int, rows: int) -> Prediction:
    """The backfill of ``partitions`` partitions of ``rows`` rows each (the rule: this module's docstring)."""
    if partitions < 1:
        raise ValueError(
            f"partitions={partitions}: a backfill has at least one partition (365 for a year of days)."
        )
    if rows < 0:
        raise ValueError(f"rows={rows}: give the rows of one partition (0 or more).")
    per = {name: round(seconds, 3) for name, seconds in periods(costs, cluster, settings, rows).items()}
    bottleneck = max(per, key=lambda name: per[name])
    period, latency = per[bottleneck], costs.latency_s(rows)
    wall = latency + (partitions - 1) * period
    jobs_cpu = partitions * (costs.preprocess.cpu_s.at(rows) + costs.train.cpu_s.at(rows))
    jobs_gpu = partitions * (costs.preprocess.gpu_s.at(rows) + costs.train.gpu_s.at(rows))
    host = costs.host_cpu_s.at(rows) * partitions / 3600 if cluster.host_cores and costs.host_cpu_s else None
    notes = []
    if cluster.host_cores and costs.host_cpu_s is None:
        notes.append(
            "Airflow shares the cluster's machine, but no host CPU-seconds were measured: host cores left out"
        )
    return Prediction(
        cluster=cluster.describe(),
        partitions=partitions,
        rows=rows,
        wall_s=wall,
        period_s=period,
        latency_s=latency,
        bottleneck=bottleneck,
        periods=per,
        pool_slots=settings.slots(cluster),
        replicas=settings.replicas(cluster),
        cluster_cpus=cluster.cpus,
        cluster_gpus=cluster.gpus,
        jobs_cpu_hours=jobs_cpu / 3600,
        jobs_gpu_hours=jobs_gpu / 3600,
        cluster_cpu_hours=cluster.cpus * wall / 3600,
        cluster_gpu_hours=cluster.gpus * wall / 3600,
        host_cpu_hours=host,
        notes=tuple(notes),
    )


def calibrate(
    costs: Costs,
    cluster: Cluster,
    settings: Settings,
    *,
    partitions: int,
    rows: int,
    wall_s: float,
    host_cpu_s: float | None = None,
) -> Costs:
    """The two costs a live Airflow adds, from a measured backfill of ``partitions`` x ``rows`` on
    ``cluster``: the machine's CPU-seconds per partition (``host_cpu_s``, all its processes' over the
    backfill; the per-row slope stays the one fitted over sizes), then Airflow's gaps between a
    partition's tasks, so that :func:`predict` gives back ``wall_s`` (never below zero)."""
    if partitions < 1 or wall_s <= 0:
        raise ValueError(f"calibrate needs a measured backfill: partitions={partitions}, wall_s={wall_s}.")
    host = costs.host_cpu_s
    if host_cpu_s is not None:
        slope = host.per_1m if host else 0.0
        host = Line(round(host_cpu_s / partitions - slope * rows / 1e6, 2), slope)

    def wall_with(gaps: float) -> float:
        trial = dataclasses.replace(costs, host_cpu_s=host, gaps=Line(gaps, costs.gaps.per_1m))
        return predict(trial, cluster, settings, partitions=partitions, rows=rows).wall_s

    # the predicted wall never falls as the gaps grow (they lengthen the latency, and through the
    # active runs possibly the period): bisect for the gaps that give the measured wall
    low, high = 0.0, wall_s
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if wall_with(middle) < wall_s else (low, middle)
    return dataclasses.replace(costs, host_cpu_s=host, gaps=Line(round(low, 2), costs.gaps.per_1m))


def assume_gpu_training(costs: Costs, gpus_per_training: float) -> Costs:
    """Costs for a shape that trains on GPUs when only CPU training was measured: each training holds
    ``gpus_per_training`` GPUs for its job's wall, and takes the seconds measured on CPUs (a stated
    assumption for the example shapes; measure on the GPU shape for its own figures)."""
    train = costs.train
    if train.gpu_s.fixed or train.gpu_s.per_1m:
        return costs  # measured: keep
    gpu_s = Line(train.job.fixed * gpus_per_training, train.job.per_1m * gpus_per_training)
    return dataclasses.replace(costs, train=dataclasses.replace(train, gpu_s=gpu_s))


# -- measured inputs (pure) ------------------------------------------------------------------------
def linear_fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares ``seconds = fixed + per_row * rows`` over ``(rows, seconds)``; None below 2 sizes."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = statistics.mean(x for x, _ in points)
    my = statistics.mean(y for _, y in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def _fit(points: list[tuple[float, float]]) -> Line:
    """:func:`linear_fit` over ``(rows, value)``; where it falls with rows, the flat line that
    fits best (the mean): the noise of close sizes, not a cost that shrinks."""
    line = linear_fit(points)
    if line is None:
        return ZERO
    fixed, per_row = line
    if per_row < 0:
        return Line(round(sum(y for _, y in points) / len(points), 3))
    return Line(round(fixed, 3), round(per_row * 1e6, 3))


def costs_from_sizes(sizes: list[dict[str, Any]], source: str = "") -> Costs:
    """Costs fitted over ``bench.pipeline.measure_size`` records of two or more partition sizes.

    Each figure the model uses is fitted as such with :func:`linear_fit` (not summed from
    fitted parts, whose noise over close sizes adds up) and counted flat when it falls with rows (:func:`_fit`): a Ray
    job's wall, CPU- and GPU-seconds (its ``usage``), what its task adds on Airflow's side (submission,
    polls, job exit), every other task's seconds, the gaps (the tasks' span less their sum), and
    ``host_cpu_s`` from each record's ``host`` when ``bench/sizing.py`` measured it.
    """
    if len({s["rows"] for s in sizes}) < 2:
        raise ValueError(
            f"costs need partitions of two sizes or more, got rows {sorted({s['rows'] for s in sizes})}: "
            "measure with --sizes 20000,200000 (add 1000000 for predictions at millions of rows)."
        )

    def fit(value: Callable[[dict[str, Any]], Any]) -> Line:
        return _fit([(s["rows"], float(value(s) or 0.0)) for s in sizes])

    ray: dict[str, RayTaskCost] = {}
    for task_id in RAY_TASKS:
        records = [s["tasks"].get(task_id, {}) for s in sizes]
        if not all("usage" in r for r in records):
            raise ValueError(
                f"a size's {task_id} task has no Ray job result (its job was not found): measure again, "
                "with the stack's Ray head up for the whole measurement."
            )
        job = fit(lambda s, t=task_id: s["tasks"][t]["usage"]["wall_seconds"])  # type: ignore[misc]
        side = fit(lambda s, t=task_id: s["tasks"][t]["total"] - s["tasks"][t]["usage"]["wall_seconds"])  # type: ignore[misc]
        cpu_s = fit(lambda s, t=task_id: s["tasks"][t]["usage"].get("cpu_seconds_reserved"))  # type: ignore[misc]
        gpu_s = fit(lambda s, t=task_id: s["tasks"][t]["usage"].get("gpu_seconds_reserved"))  # type: ignore[misc]
        ray[task_id] = RayTaskCost(task=job + side, job=job, cpu_s=cpu_s, gpu_s=gpu_s)
    others = [t for t in sizes[0]["tasks"] if t not in RAY_TASKS]
    airflow = {t: fit(lambda s, t=t: s["tasks"].get(t, {}).get("total")) for t in others}  # type: ignore[misc]
    gaps = fit(lambda s: s["tasks_span_s"] - sum(task["total"] for task in s["tasks"].values()))
    host = fit(lambda s: s["host"]["cpu_s"]) if all("host" in s for s in sizes) else None
    return Costs(
        preprocess=ray["preprocess"],
        train=ray["train"],
        airflow_tasks=airflow,
        gaps=Line(max(gaps.fixed, 0.0), gaps.per_1m),
        host_cpu_s=host,
        source=source,
    )


def _duration(seconds: float) -> str:
    if seconds < 600:
        return f"{seconds:.0f} s"
    if seconds < 3 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
