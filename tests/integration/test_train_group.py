"""A warm training worker group (``TorchTrainOperator(worker_group="shared")``) on the real local Ray
cluster, MLflow store and COS stand-in: it trains the same model as Ray Train's own worker group,
serves the next training warm, keeps checkpoints as Ray Train does, and gives way to jobs that need
its CPUs. Its faults (a killed worker, a killed job) are in ``test_train_resume``, run for both groups.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest

from emr_ray.cluster import storage
from emr_ray.cluster.jobs._runtime import main
from emr_ray.hooks.ray import RayHook
from tests.fixtures.ray import live_actors
from tests.integration.test_ray_jobs import FakeTaskInstance
from tests.integration.test_train_resume import epochs_logged, make_operator
from tests.integration.test_train_resume import staged as staged  # the fixture

pytestmark = pytest.mark.integration


def live_groups(hook: RayHook, field: str = "name") -> list[str]:
    """The live warm worker groups (their coordinators)."""
    return live_actors(hook, "WarmTrainGroup", field)


def checkpoint_epochs(path: str, options: storage.StorageOptions | None = None) -> list[int]:
    import json

    from pyarrow import fs as pafs

    fsys, root = storage.resolve(path, options)
    epochs = []
    for info in fsys.get_file_info(pafs.FileSelector(root)):
        if info.type == pafs.FileType.Directory and info.base_name.startswith("checkpoint_"):
            with fsys.open_input_stream(f"{info.path}/metrics.json") as f:
                epochs.append(int(json.loads(f.read().decode())["epoch"]))
    return sorted(epochs)


def test_a_warm_group_trains_the_same_model_as_ray_train_serves_the_next_training_warm_and_gives_way_when_idle(
    ray_conn,
    mlflow_conn,
    cos_server,
    cos_conn,
    staged,
    tmp_path,
):
    config = {"epochs": 3}
    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    first = make_operator(staged, tmp_path, config, num_to_keep=1, worker_group="shared").execute(
        {"ti": FakeTaskInstance("train_shared", run_id=run_id)}
    )
    assert first["epochs_completed"] == 3 and first["final_metrics"]["start_epoch"] == 0
    assert epochs_logged(mlflow_conn.tracking_uri, first["mlflow_run_id"]) == [0, 1, 2]
    assert first["best_metrics"]["epoch"] == min(range(3), key=lambda e: checkpoint_loss(first, e))
    group = first["worker_group"]
    assert group["name"] in live_groups(RayHook(ray_conn))

    # the next training (another task, its checkpoints in COS) runs warm in the same group
    second_op = make_operator(staged, tmp_path, config, num_to_keep=1, worker_group="shared")
    from devstack.constants import BUCKET

    second_op.storage_path = f"cos://{BUCKET}/ckpt-{uuid.uuid4().hex[:8]}"
    second = second_op.execute({"ti": FakeTaskInstance("train_shared_cos", run_id=run_id)})
    assert second["worker_group"]["name"] == group["name"] and second["worker_group"]["reused"]
    assert second["final_metrics"]["test_loss"] == pytest.approx(
        first["final_metrics"]["test_loss"], rel=1e-4
    )
    # num_to_keep=1: the best checkpoint and the latest stay, the others are deleted
    options = cos_options(cos_server)
    kept = checkpoint_epochs(second["checkpoint_uri"].rsplit("/", 1)[0], options)
    assert set(kept) == {second["best_metrics"]["epoch"], 2}
    fsys, path = storage.resolve(second["checkpoint_uri"], options)
    with fsys.open_input_stream(f"{path}/state.pt") as f:
        assert len(f.read()) > 1000  # the weights, uploaded whole with the call's COS keys

    # Ray Train's own worker group (``worker_group="job"``, 2 workers) needs the CPUs the idle warm
    # group holds on this small cluster: the job releases the group instead of waiting for its idle
    # timeout, and trains the same model, epoch for epoch (the same loop, shards, seed and process group)
    by_ray_train = make_operator(staged, tmp_path, config, num_to_keep=1).execute(
        {"ti": FakeTaskInstance("train_job", run_id=run_id)}
    )
    assert group["name"] not in live_groups(RayHook(ray_conn))
    for key in ("train_loss", "test_loss", "test_accuracy"):
        assert first["final_metrics"][key] == pytest.approx(by_ray_train["final_metrics"][key], rel=1e-4), key
    # MLflow itself shows the data each run trained on, whoever started the run: the same generations
    shown = run_datasets(first)
    assert shown == run_datasets(by_ray_train) and "train" in shown and all(shown.values())


def run_datasets(result: dict) -> dict[str, str]:
    """The run's MLflow dataset inputs, name to digest."""
    import mlflow

    run = mlflow.MlflowClient(tracking_uri=result["tracking_uri"]).get_run(result["mlflow_run_id"])
    return {item.dataset.name: item.dataset.digest for item in run.inputs.dataset_inputs}


def checkpoint_loss(result: dict, epoch: int) -> float:
    import mlflow

    history = mlflow.MlflowClient(tracking_uri=result["tracking_uri"]).get_metric_history(
        result["mlflow_run_id"], "test_loss"
    )
    return next(m.value for m in history if m.step == epoch)


def cos_options(cos_server) -> storage.StorageOptions:
    from devstack.constants import REGION, SECRET_ID, SECRET_KEY

    return storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                  access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip


def slow_usage(seconds: float) -> str:
    time.sleep(seconds)  # an MLflow that answers slowly (the finished job's usage)
    return "usage logged"


def begin_run() -> str:
    return "run started"


def next_job_beside_a_slow_finished_one(spec: dict[str, Any]) -> dict[str, Any]:
    """The job: on a warm group's rank 0 (a real ``TrainWorker`` actor), a finished job's usage step
    hangs on MLflow; the next job's first step asks meanwhile."""
    import ray

    from emr_ray.cluster.jobs.train_group import remote_worker

    ray.init(address="auto", logging_level=logging.WARNING)
    rank0 = remote_worker().options(num_cpus=0).remote(0, 1, False)
    ray.get(rank0.alive.options(concurrency_group="control").remote())
    usage = rank0.after_lease.options(concurrency_group="after_lease").remote(slow_usage, {"seconds": 60})
    begun = ray.get(rank0.mlflow_step.options(concurrency_group="control").remote(begin_run, {}, {}))
    usage_pending = not ray.wait([usage], timeout=0)[0]
    ray.kill(rank0)
    return {"begun": begun, "usage_pending": usage_pending}


def test_the_next_jobs_steps_on_rank_0_never_queue_behind_a_finished_jobs_slow_usage(ray_conn):
    """Issue 32, item 3: a finished job's last MLflow step on rank 0 (its usage, after its lease) hangs
    on a slow MLflow; the next job's run start on the same rank 0 answers meanwhile (before: both took
    rank 0's one control slot, so the next job waited for the previous one's MLflow)."""
    from emr_ray.operators.ray import RayJobOperator

    op = RayJobOperator(
        task_id="slow_usage", job_module="tests.integration.test_train_group", poll_interval=0.5
    )
    result = op.execute({"ti": FakeTaskInstance("slow_usage")})
    assert result["begun"] == "run started" and result["usage_pending"]


if __name__ == "__main__":
    main(next_job_beside_a_slow_finished_one)
