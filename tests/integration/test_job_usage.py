"""Every Ray job's result carries what it used (``emr_ray.cluster.jobs._usage``), measured on a real local Ray
head through the Jobs API; the operator logs it and its XCom carries it; the training operator logs it
on the MLflow run.

This module is also a job (``python -m tests.integration.test_job_usage``): it holds one 1-CPU actor
for a few seconds, so the test can check the CPU-seconds against the actor's known lifetime.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any

import pytest

from emr_ray.cluster.jobs import _usage
from emr_ray.cluster.jobs._runtime import main

pytestmark = pytest.mark.integration

HOLD_SECONDS = 2.0


def hold_an_actor(spec: dict[str, Any]) -> dict[str, Any]:
    """The job: a 1-CPU actor alive for ``seconds``, then killed."""
    import ray

    ray.init(address="auto", logging_level=logging.WARNING)

    @ray.remote(num_cpus=1)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()  # type: ignore[attr-defined]
    ray.get(holder.ready.remote())
    with _usage.phase("hold"):
        time.sleep(float(spec["seconds"]))
    ray.kill(holder)
    return {"held_for": spec["seconds"]}


class TaskInstance:
    """Just enough of a task instance for ``execute()``: identity fields and an XCom recorder."""

    def __init__(self, task_id: str) -> None:
        self.dag_id, self.task_id, self.map_index, self.try_number = "tests", task_id, -1, 1
        self.run_id = f"manual__{uuid.uuid4().hex[:8]}"
        self.xcom: dict[str, object] = {}

    def xcom_push(self, key: str, value: object) -> None:
        self.xcom[key] = value


def test_an_actors_cpu_seconds_cover_its_lifetime_and_the_drivers_reservation_counts(ray_conn, capsys):
    from emr_ray.operators.ray import RayJobOperator

    op = RayJobOperator(
        task_id="hold",
        job_module="tests.integration.test_job_usage",
        spec={"seconds": HOLD_SECONDS},
        entrypoint_num_cpus=0.5,
        poll_interval=0.5,
    )
    result = op.execute({"ti": TaskInstance("hold")})

    usage = result["usage"]
    assert result["held_for"] == HOLD_SECONDS
    assert usage["actors"] == 1 and usage["missing"] == []
    actor = usage["held"]["actor:Holder"]
    # alive at least for the hold, at most for the driver's whole life
    assert HOLD_SECONDS <= actor["seconds"] <= usage["wall_seconds"]
    assert actor["cpu_seconds"] == actor["seconds"]  # 1 CPU
    (driver,) = [row for name, row in usage["held"].items() if name.startswith("driver:")]
    assert driver["cpu_seconds"] >= 0.5 * HOLD_SECONDS  # entrypoint_num_cpus=0.5 for the whole job
    assert usage["cpu_seconds_reserved"] == pytest.approx(
        actor["cpu_seconds"] + driver["cpu_seconds"], abs=0.05
    )
    assert usage["gpu_seconds_reserved"] == 0.0
    assert usage["phases"]["hold"] >= HOLD_SECONDS and usage["phases"]["startup"] > 0
    assert usage["memory"]["driver_peak_rss_mb"] > 50  # a Python process with Ray imported
    assert usage["ended_at"] - usage["started_at"] == pytest.approx(usage["wall_seconds"], abs=0.05)
    assert "Used: 1 job, " in capsys.readouterr().out  # the task log's line


def test_the_echo_jobs_tasks_are_counted_and_the_usage_is_in_the_xcom(ray_conn):
    from emr_ray.operators.ray import RayJobOperator

    result = RayJobOperator(
        task_id="echo", spec={"payload": 1, "spread_tasks": 2}, poll_interval=0.5
    ).execute({"ti": TaskInstance("echo")})

    usage = result["usage"]
    assert result["echo"] == 1 and usage["tasks"] == 2 and usage["actors"] == 0
    # two 1-CPU tasks that each sleep 1 s
    assert usage["held"]["task:where"]["count"] == 2
    assert 2.0 <= usage["cpu_seconds_reserved"] <= 2 * usage["wall_seconds"]


def test_a_job_without_ray_reports_its_wall_time_and_holds_nothing(ray_conn):
    from emr_ray.operators.ray import RayJobOperator

    usage = RayJobOperator(task_id="echo", spec={"payload": 1}, poll_interval=0.5).execute(
        {"ti": TaskInstance("echo")}
    )["usage"]
    assert usage["cpu_seconds_reserved"] == 0.0 and usage["actors"] == usage["tasks"] == 0
    assert usage["missing"] == [] and usage["wall_seconds"] > 0


def test_the_training_job_logs_its_usage_on_the_mlflow_run_it_trained(mlflow_conn):
    """The training job itself records its usage on its MLflow run once the result is complete (the
    Airflow side needs no MLflow client for it); a reused run keeps the figures of its own job."""
    import mlflow

    from emr_ray.cluster.jobs.train_mlflow import log_usage
    from emr_ray.cluster.results import TrainResult, Usage
    from emr_ray.cluster.spec import MLflowSection, TrainJobSpec

    client = mlflow.MlflowClient(tracking_uri=mlflow_conn.tracking_uri)
    experiment = client.create_experiment(f"usage-{uuid.uuid4().hex[:8]}")
    trained, reused = (client.create_run(experiment).info.run_id for _ in range(2))
    usage = Usage(wall_seconds=50.0, cpu_seconds_reserved=80.5, gpu_seconds_reserved=0.0,
                  memory={"driver_peak_rss_mb": 400.0}, phases={"fit": 30.0, "log": 4.0})  # fmt: skip
    spec = TrainJobSpec(train_loop="include.models.tabular:train_loop", datasets={"train": "file:///d/dt=2026-01-01"},
                        run_name="r", storage_path="file:///tmp",
                        mlflow=MLflowSection(mlflow_conn.tracking_uri, "usage"))  # fmt: skip

    result = TrainResult(mlflow_run_id=trained, tracking_uri=mlflow_conn.tracking_uri, run_name="r",
                         checkpoint_uri="file:///tmp/r/best", final_metrics={}, usage=usage)  # fmt: skip
    log_usage(spec, result)
    log_usage(spec, dataclasses.replace(result, mlflow_run_id=reused, reused=True))

    metrics = client.get_run(trained).data.metrics
    assert metrics["usage.cpu_seconds_reserved"] == 80.5 and metrics["usage.phase.fit_seconds"] == 30.0
    assert metrics["usage.wall_seconds"] == 50.0 and metrics["usage.driver_peak_rss_mb"] == 400.0
    assert client.get_run(reused).data.metrics == {}  # its figures belong to the job that trained it


if __name__ == "__main__":
    main(hold_an_actor)
