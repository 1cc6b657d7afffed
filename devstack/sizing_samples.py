"""Sample measured costs for the sizing model's checks: one set of per-task costs (``COSTS``) and one
``bench.pipeline.measure_size`` record (:func:`size_record`), shared by the provider's tests of
``emr_ray.sizing`` and the benchmark's own checks (``bench/checks/``), which import no tests."""

from __future__ import annotations

from emr_ray.sizing.model import Costs, Line, RayTaskCost

#: a partition's costs in the shape the local measurements have (seconds, CPU-seconds)
COSTS = Costs(
    preprocess=RayTaskCost(task=Line(8.0, 2.0), job=Line(6.0, 2.0), cpu_s=Line(4.0, 1.0)),
    train=RayTaskCost(task=Line(12.0, 20.0), job=Line(10.0, 20.0), cpu_s=Line(18.0, 40.0)),
    airflow_tasks={
        "wait_for_partition": Line(3.0),
        "check_cluster": Line(0.2),
        "unless_dry_run": Line(0.1),
        "register": Line(2.0),
    },  # fmt: skip
    gaps=Line(1.0),
)


def size_record(rows: int, train_s: float, sensor_s: float, host_cpu_s: float | None = None) -> dict:
    """One ``bench.pipeline.measure_size`` record, as much of it as the costs read."""

    def ray_task(total: float, wall: float, cpu: float) -> dict:
        usage = {"wall_seconds": wall, "cpu_seconds_reserved": cpu, "gpu_seconds_reserved": 0.0}
        return {"airflow_start": 0.1, "read": wall / 2, "total": total, "usage": usage}

    tasks = {"wait_for_partition": {"total": sensor_s}, "check_cluster": {"total": 0.1},
             "preprocess": ray_task(6.0, 5.0, 3.5), "unless_dry_run": {"total": 0.1},
             "train": ray_task(train_s, train_s - 1.0, 2 * (train_s - 2.0)), "register": {"total": 2.0}}  # fmt: skip
    record = {"rows": rows, "tasks": tasks, "tasks_span_s": sum(t["total"] for t in tasks.values()) + 1.5}
    return record | ({"host": {"cpu_s": host_cpu_s}} if host_cpu_s is not None else {})
