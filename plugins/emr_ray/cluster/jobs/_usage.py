"""What a Ray job used, added as ``usage`` to every job's result by :func:`emr_ray.cluster.jobs._runtime.main`.

- ``wall_seconds``: the job's driver process, from its start to its result (``started_at`` and
  ``ended_at`` are the same two moments as epoch seconds, to line up with the Jobs API's times).
- ``cpu_seconds_reserved`` / ``gpu_seconds_reserved``: what the job's actors and tasks held, each one's
  required CPUs (GPUs) times how long it held them: actors from alive to dead (Spark executors and
  the app master, Ray Train's controller and workers; from the GCS actor table, which keeps the
  start and end times that the state API's actor columns leave out), tasks from running to finished
  (the state API's task list), plus the driver's own ``entrypoint_num_cpus`` (its supervisor actor).
  Placement-group bundles count through the actors placed in them. Reserved, not busy: an idle
  executor counts. An actor's worker-process start before it is alive does not count, so the figure
  is a lower bound of what the scheduler held.
- ``memory``: ``driver_peak_rss_mb`` (the driver process) and ``children_peak_rss_mb`` (the largest
  of its exited child processes, e.g. a stopped Spark driver JVM), from ``getrusage``; and
  ``reserved_peak_mb``, the most Ray ``memory`` resource the job's actors and tasks held at one
  time. Ray reports no peak RSS of actor and task processes: those are not covered.
- ``phases``: seconds per named step of the job (:func:`phase`, :func:`lap`); ``startup`` is the
  driver process's start to :func:`start` (interpreter and imports).
- ``held``: per actor class or task name, how many, their seconds and CPU-seconds.
- ``pool_idle``: the seconds, CPU- and GPU-seconds the warm pools this job used sat idle before its
  calls (a pool's cost between jobs is counted by the job that ends the idle stretch, never hidden);
  not part of the reserved figures, which are what the job itself held.
- ``missing``: what could not be measured, and why; ``measuring_seconds``: what measuring took (after
  ``ended_at``). Measuring never fails a job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from emr_ray.cluster.results import PoolIdle, Usage
from emr_ray.cluster.warm.lease import PoolCall

# -- phases -----------------------------------------------------------------------------------------


@dataclass
class Recorder:
    """Seconds per named phase of one job. :meth:`phase` times a block; :meth:`lap` times the stretch
    since the previous phase ended, so one line after each step splits a function without re-indenting it."""

    clock: Callable[[], float] = time.monotonic
    phases: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self.started_at = time.time()
        self._mark = self.started

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        begun = self.clock()
        try:
            yield
        finally:
            self._mark = self.clock()
            self.add(name, self._mark - begun)

    def lap(self, name: str, **inside: float) -> None:
        """The seconds since the previous phase or lap go to ``name``, less ``inside`` (sub-steps that the
        job timed itself, e.g. ``fit=12.3``), which are recorded under their own names."""
        now = self.clock()
        elapsed, self._mark = now - self._mark, now
        for part, seconds in inside.items():
            self.add(part, seconds)
            elapsed -= seconds
        self.add(name, max(elapsed, 0.0))

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def seconds(self) -> float:
        return self.clock() - self.started


_current = Recorder()


_borrowed: list[Held] = []
_idle: list[Held] = []


def start() -> Recorder:
    """A fresh recorder for this job (the job runtime calls it first thing)."""
    global _current
    _current = Recorder()
    _borrowed.clear()
    _idle.clear()
    return _current


def phase(name: str):
    """``with phase("spark_start"): ...``: time a block of the running job."""
    return _current.phase(name)


def lap(name: str, **inside: float) -> None:
    """Close the stretch since the previous phase as ``name`` (see :meth:`Recorder.lap`)."""
    _current.lap(name, **inside)


def borrow(
    kind: str, name: str, resources: Mapping[str, float], start: float, end: float, idle_before: float = 0.0
) -> None:
    """Resources this job used that belong to no actor or task of its own: a shared Spark session's
    executors for the seconds of this job's call (epoch seconds); ``idle_before``: the seconds the
    pool sat idle, holding them, before this call (``pool_idle``)."""
    _borrowed.append(Held(kind, name, dict(resources), start, end))
    if idle_before > 0:
        _idle.append(Held("idle", name, dict(resources), start - idle_before, start))


def borrow_call(name: str, call: PoolCall) -> None:
    """A warm pool's call, charged to this job (:func:`borrow`): what the pool held for the call's
    seconds, and its idle seconds before the call."""
    borrow("actor", name, call.resources, call.started_at, call.ended_at, idle_before=call.use.idle_seconds)


# -- reservations (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """One actor, task or driver that held cluster resources from ``start`` to ``end`` (epoch seconds;
    ``end`` None: still held when measured)."""

    kind: str
    name: str
    resources: Mapping[str, float]
    start: float
    end: float | None = None

    def seconds(self, now: float) -> float:
        return max((self.end if self.end is not None else now) - self.start, 0.0)


def base_resources(required: Mapping[str, float]) -> dict[str, float]:
    """Ray's required resources by plain name: inside a placement group an actor asks for
    ``CPU_group_<pg>`` and ``CPU_group_<i>_<pg>`` (the same CPU twice), and ``bundle_group_*`` markers."""
    out: dict[str, float] = {}
    for key, value in required.items():
        base = key.split("_group_", 1)[0]
        if base != "bundle":
            out[base] = max(out.get(base, 0.0), float(value))
    return out


def resource_seconds(held: list[Held], resource_name: str, now: float) -> float:
    return sum(h.resources.get(resource_name, 0.0) * h.seconds(now) for h in held)


def peak(held: list[Held], resource_name: str, now: float) -> float:
    """The most of ``resource_name`` held at one time (a sweep over the start and end times)."""
    events: list[tuple[float, float]] = []
    for h in held:
        amount = h.resources.get(resource_name, 0.0)
        if amount:
            events += [(h.start, amount), (h.end if h.end is not None else now, -amount)]
    level = top = 0.0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at one instant
        level += change
        top = max(top, level)
    return top


def by_name(held: list[Held], now: float) -> dict[str, dict[str, float]]:
    """Count, seconds and CPU/GPU-seconds per actor class or task name."""
    out: dict[str, dict[str, float]] = {}
    for h in held:
        row = out.setdefault(f"{h.kind}:{h.name}", {"count": 0, "seconds": 0.0, "cpu_seconds": 0.0})
        row["count"] += 1
        row["seconds"] = round(row["seconds"] + h.seconds(now), 2)
        row["cpu_seconds"] = round(row["cpu_seconds"] + h.resources.get("CPU", 0.0) * h.seconds(now), 2)
        if h.resources.get("GPU"):
            row["gpu_seconds"] = round(row.get("gpu_seconds", 0.0) + h.resources["GPU"] * h.seconds(now), 2)
    return out


def summary(usage: Usage | None) -> str:
    """One line for the task log: ``1 job, 34.2 s wall, 61.0 CPU-s and 0.0 GPU-s reserved, ...``."""
    if usage is None or not usage.measured:
        return f"usage not measured ({usage.error if usage and usage.error else 'the job reported none'})"
    memory = usage.memory or {}
    parts = [
        f"1 job, {usage.wall_seconds:.1f} s wall",
        f"{usage.cpu_seconds_reserved or 0:.1f} CPU-s and {usage.gpu_seconds_reserved or 0:.1f} "
        f"GPU-s reserved ({usage.actors or 0} actor(s), {usage.tasks or 0} task(s))",
    ]
    if memory.get("driver_peak_rss_mb") is not None:
        parts.append(f"driver peak RSS {memory['driver_peak_rss_mb']:.0f} MB")
    if memory.get("reserved_peak_mb"):
        parts.append(f"peak memory reserved {memory['reserved_peak_mb']:.0f} MB")
    if usage.phases:
        parts.append("phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in usage.phases.items()))
    if idle := usage.pool_idle:
        parts.append(
            f"warm pools idle before its calls {idle.seconds:.0f} s ({idle.cpu_seconds:.1f} CPU-s, "
            f"{idle.gpu_seconds:.1f} GPU-s)"
        )
    if usage.missing:
        parts.append("not measured: " + "; ".join(usage.missing))
    return ", ".join(parts)


def mlflow_metrics(usage: Usage | None) -> dict[str, float]:
    """The figures of ``usage`` as MLflow metric names and values (``usage.cpu_seconds_reserved``,
    ``usage.phase.fit_seconds``...): how a training run carries what it cost."""
    if usage is None or not usage.measured:
        return {}
    out = {
        f"usage.{key}": float(value)
        for key in ("wall_seconds", "cpu_seconds_reserved", "gpu_seconds_reserved")
        if isinstance(value := getattr(usage, key), int | float)
    }
    for key, value in (usage.memory or {}).items():
        if isinstance(value, int | float):
            out[f"usage.{key}"] = float(value)
    for name, seconds in usage.phases.items():
        out[f"usage.phase.{name}_seconds"] = float(seconds)
    if idle := usage.pool_idle:
        out |= {
            "usage.pool_idle_seconds": float(idle.seconds),
            "usage.pool_idle_cpu_seconds": float(idle.cpu_seconds),
            "usage.pool_idle_gpu_seconds": float(idle.gpu_seconds),
        }
    return out


# -- measuring --------------------------------------------------------------------------------------


def report(recorder: Recorder | None = None) -> Usage:
    """The ``usage`` of the running job. Never raises: what fails is named under ``missing``."""
    recorder = recorder or _current
    try:
        ended_at = time.time()
        wall = recorder.seconds()
        missing: list[str] = []
        process_started_at = _process_started_at(missing)
        phases = {"startup": max(recorder.started_at - process_started_at, 0.0)} if process_started_at else {}
        phases |= recorder.phases
        held = collect(ended_at, missing, since=process_started_at or recorder.started_at)
        started_at = process_started_at or recorder.started_at
        idle = None
        if _idle:
            idle = PoolIdle(
                seconds=round(sum(h.seconds(ended_at) for h in _idle), 2),
                cpu_seconds=round(resource_seconds(_idle, "CPU", ended_at), 2),
                gpu_seconds=round(resource_seconds(_idle, "GPU", ended_at), 2),
            )
        usage = Usage(
            started_at=round(started_at, 3),
            ended_at=round(ended_at, 3),
            wall_seconds=round(ended_at - started_at if process_started_at else wall, 2),
            cpu_seconds_reserved=round(resource_seconds(held, "CPU", ended_at), 2),
            gpu_seconds_reserved=round(resource_seconds(held, "GPU", ended_at), 2),
            actors=sum(h.kind == "actor" for h in held),
            tasks=sum(h.kind == "task" for h in held),
            held=by_name(held, ended_at),
            memory=_memory(held, ended_at),
            phases={k: round(v, 2) for k, v in phases.items()},
            missing=missing,
            pool_idle=idle,
        )
        # after ended_at: in the job's exit
        return dataclasses.replace(usage, measuring_seconds=round(time.time() - ended_at, 2))
    except Exception as e:  # accounting must never fail the job
        return Usage(
            error=f"{type(e).__name__}: {e}", phases={k: round(v, 2) for k, v in recorder.phases.items()}
        )


def _process_started_at(missing: list[str]) -> float | None:
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception as e:
        missing.append(f"driver process start ({type(e).__name__}: {e}); wall time counts from the runtime")
        return None


def _memory(held: list[Held], now: float) -> dict[str, float | None]:
    mb = 1024.0  # ru_maxrss is in KiB on Linux
    return {
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / mb, 1),
        "children_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / mb, 1) or None,
        "reserved_peak_mb": round(peak(held, "memory", now) / 2**20, 1) or None,
    }


def collect(now: float, missing: list[str], since: float = 0.0) -> list[Held]:
    """The actors, tasks and driver reservation of this job, and the actors of the drivers it started
    (``since`` its start), from the cluster; each failure is named in ``missing``. A job that never
    connected to Ray (``ray.init``) held nothing."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return list(_borrowed)
    job_id = ray.get_runtime_context().get_job_id()
    held: list[Held] = list(_borrowed)
    for what, reader in (("actors", _actors), ("tasks", _tasks), ("driver reservation", _driver)):
        try:
            held += reader(job_id, now)
        except Exception as e:
            missing.append(f"{what} ({type(e).__name__}: {e})")
    try:
        for child in _started_drivers(job_id, since):
            held += _actors(child, now)
    except Exception as e:
        missing.append(f"actors of the drivers this job started ({type(e).__name__}: {e})")
    return held


def _actor_held(data: Any) -> Held | None:
    """An ``ActorTableData`` record as :class:`Held` (None for an actor that never became alive)."""
    if not data.start_time:
        return None
    name = data.class_name.rsplit(".", 1)[-1] or "actor"
    end = data.end_time / 1000 if data.end_time else None
    return Held("actor", name, base_resources(dict(data.required_resources)), data.start_time / 1000, end)


def _actor_record(raw: bytes) -> Any:
    from ray.core.generated import gcs_pb2

    return gcs_pb2.ActorTableData.FromString(raw)  # type: ignore[attr-defined]


def _gcs():
    from ray._private.state import state

    return state._connect_and_get_accessor()


def _actors(job_id: str, now: float) -> list[Held]:
    import ray

    records = _gcs().get_actor_table(ray.JobID.from_hex(job_id), None)
    held = [_actor_held(_actor_record(raw)) for raw in records]
    return [h for h in held if h is not None]


def _started_drivers(job_id: str, since: float) -> list[str]:
    """Jobs of the drivers this job started: RayDP's app master is a Java driver of its own (in this
    job's namespace, which the Jobs API makes unique per job), and Spark's executors are its actors."""
    import ray
    from ray.core.generated import gcs_pb2

    namespace = ray.get_runtime_context().namespace
    records = _gcs().get_job_table(skip_submission_job_info_field=True, skip_is_running_tasks_field=True)
    children = []
    for raw in records:
        entry = gcs_pb2.JobTableData.FromString(raw)  # type: ignore[attr-defined]
        if entry.job_id.hex() != job_id and entry.config.ray_namespace == namespace:
            if entry.start_time / 1000 >= since:
                children.append(entry.job_id.hex())
    return children


def _tasks(job_id: str, now: float) -> list[Held]:
    """The job's normal tasks (an actor's methods run on its reservation). Task events reach the GCS
    about once a second, so tasks still shown running are read again once before ``now`` closes them."""
    from ray.util.state import list_tasks

    def read() -> list[Any]:
        tasks = list_tasks(
            filters=[("job_id", "=", job_id)],
            detail=True,
            limit=10_000,
            timeout=10,
            raise_on_missing_output=False,
        )
        return [t for t in tasks if t.type == "NORMAL_TASK" and t.start_time_ms]

    tasks = read()
    if any(t.end_time_ms is None for t in tasks):
        time.sleep(1.5)
        tasks = read()
    return [
        Held(
            "task",
            t.func_or_class_name or t.name,
            base_resources(t.required_resources or {}),
            t.start_time_ms / 1000,
            t.end_time_ms / 1000 if t.end_time_ms else None,
        )
        for t in tasks
    ]


def _driver(job_id: str, now: float) -> list[Held]:
    """What the Jobs API reserved for the driver (``entrypoint_num_cpus``...): its supervisor actor's
    resources since that actor started; nothing outside a submitted job."""
    import ray
    from ray.dashboard.modules.job.common import JOB_ACTOR_NAME_TEMPLATE, SUPERVISOR_ACTOR_RAY_NAMESPACE

    config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    submission_id = (config.get("metadata") or {}).get("job_submission_id")
    if not submission_id:
        return []
    supervisor = ray.get_actor(
        JOB_ACTOR_NAME_TEMPLATE.format(job_id=submission_id), namespace=SUPERVISOR_ACTOR_RAY_NAMESPACE
    )
    raw = _gcs().get_actor_info(supervisor._actor_id)
    held = _actor_held(_actor_record(raw)) if raw else None
    if held is None or not held.resources:
        return []
    return [Held("driver", submission_id, held.resources, held.start, None)]
