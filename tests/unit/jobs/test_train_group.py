"""The warm training worker group without a cluster (``emr_ray.jobs.train_group``,
``train_checkpoints``): which trainings may share a group, how a run's checkpoints are kept and
found, and the project's loop running in a warm worker's context (``emr_ray.train.WarmCall``), in
this process with torch and real Parquet files. On a real cluster: ``tests/integration/test_train_group.py``.
"""

from __future__ import annotations

import json
import os

import pytest

from emr_ray import train as emr_train
from emr_ray.jobs import shards, train_checkpoints
from emr_ray.jobs.train_checkpoints import CheckpointStore
from emr_ray.jobs.train_group import NAME_PREFIX, bundle, group_key
from emr_ray.spec import CheckpointSpec, ScalingSpec

SCALING = ScalingSpec(num_workers=2).to_dict()
JOB_ENV = {
    "py_modules": ["gcs://_ray_pkg_emr_ray_0123abcd.zip"],
    "env_vars": {"PYTHONPATH": "/srv/project", "EMR_RAY_SECRETS_REF": "gcs://_emr_ray_secrets_x.zip"},
}


def test_trainings_with_the_same_scaling_and_code_share_a_group_whatever_their_secrets():
    from emr_ray.jobs.warm import pool_runtime_env

    other_secret = {**JOB_ENV, "env_vars": {**JOB_ENV["env_vars"], "EMR_RAY_SECRETS_REF": "gcs://y.zip"}}
    one, two = (
        group_key(SCALING, pool_runtime_env(JOB_ENV)),
        group_key(SCALING, pool_runtime_env(other_secret)),
    )
    assert one == two and one.startswith(NAME_PREFIX)
    assert group_key(ScalingSpec(num_workers=3).to_dict(), pool_runtime_env(JOB_ENV)) != one
    assert group_key(SCALING, pool_runtime_env(JOB_ENV | {"py_modules": ["gcs://_ray_pkg_other.zip"]})) != one


def test_a_worker_holds_one_cpu_and_a_gpu_only_when_asked():
    assert bundle(SCALING) == {"CPU": 1.0}
    assert bundle(ScalingSpec(1, use_gpu=True).to_dict()) == {"CPU": 1.0, "GPU": 1.0}
    assert bundle(ScalingSpec(1, resources_per_worker={"CPU": 4, "memory": 1e9}).to_dict()) == {
        "CPU": 4.0,
        "memory": 1e9,
    }


def test_the_worker_group_mode_is_checked_when_the_spec_is_built():
    from emr_ray.spec import TrainJobSpec

    with pytest.raises(ValueError, match=r"worker_group='warm': use 'job' .* or 'shared'"):
        TrainJobSpec(
            train_loop="include.models.tabular:train_loop", datasets={"train": "file:///d/dt=2026-01-01"},
            run_name="r", storage_path="file:///c", mlflow={"tracking_uri": "http://127.0.0.1:1", "experiment_name": "e"},
            worker_group="warm",
        )  # fmt: skip


def write_checkpoint(fsys, run_path: str, tmp_path, epoch: int, loss: float | None, *, complete=True) -> str:
    local = tmp_path / f"local-{epoch}"
    local.mkdir()
    (local / emr_train.STATE_FILE).write_bytes(b"weights")
    if complete:
        (local / emr_train.METRICS_FILE).write_text(json.dumps({"epoch": epoch, "test_loss": loss}))
    return train_checkpoints.upload(str(local), fsys, run_path, epoch)


def test_the_store_keeps_the_best_and_the_latest_and_never_reads_an_incomplete_checkpoint(tmp_path):
    from pyarrow import fs as pafs

    fsys, run_path = pafs.LocalFileSystem(), str(tmp_path / "run")
    for epoch, loss in enumerate([0.9, 0.4, 0.6, 0.7]):
        write_checkpoint(fsys, run_path, tmp_path, epoch, loss)
    write_checkpoint(fsys, run_path, tmp_path, 4, None, complete=False)  # crashed during its upload
    store = CheckpointStore(fsys, run_path, CheckpointSpec(num_to_keep=1, score_attribute="test_loss"))
    assert int(store.latest()[1]["epoch"]) == 3
    kept = store.retain()
    assert [int(m["epoch"]) for _, m in kept] == [1, 3]  # the best (loss 0.4), then the latest
    left = sorted(os.listdir(run_path))
    assert left == [train_checkpoints.directory_name(e) for e in (1, 3, 4)]
    with kept[0][0].as_directory() as directory:
        assert open(os.path.join(directory, emr_train.STATE_FILE), "rb").read() == b"weights"
    maximize = CheckpointStore(fsys, run_path, CheckpointSpec(num_to_keep=None, score_order="max"))
    assert int(maximize.ranked()[0][1]["epoch"]) == 3


@pytest.fixture
def plan(tmp_path):
    import pyarrow.parquet as pq

    from include.data.synthetic import FEATURE_COLUMNS, make_partition

    table = make_partition("2026-11-05", 600)
    datasets = {}
    for name, rows in (("train", table.slice(0, 500)), ("test", table.slice(500))):
        path = str(tmp_path / f"{name}.parquet")
        pq.write_table(rows, path)
        datasets[name] = shards.describe(f"file://{tmp_path}", [(path, rows.num_rows)], equal=name == "train")
    config = {"feature_columns": FEATURE_COLUMNS, "label_column": "label", "epochs": 3, "batch_size": 64}
    return config | {shards.PLAN_KEY: {"datasets": datasets, "storage": {}}}


def run_loop(config, reports, resume_dir=None):
    import torch

    from emr_ray.storage import StorageOptions
    from include.models.tabular import train_loop

    def report(metrics, directory):
        state = emr_train.load_state(directory) if directory else None
        reports.append((metrics, state))

    emr_train._warm = emr_train.WarmCall(0, 1, torch.device("cpu"), StorageOptions(), resume_dir, report)
    try:
        train_loop(config)
    finally:
        emr_train._warm = None


def test_the_projects_loop_runs_in_a_warm_workers_context_and_resumes_from_its_checkpoint(plan, tmp_path):
    reports: list = []
    run_loop(plan, reports)
    assert [m["epoch"] for m, _ in reports] == [0, 1, 2]
    assert all(state is not None and state.epoch == m["epoch"] for m, state in reports)  # rank 0 checkpoints
    assert reports[0][0]["train_rows"] == 500 and reports[0][0]["start_epoch"] == 0

    resume = tmp_path / "resume"
    resume.mkdir()
    emr_train.save_state(str(resume), model=build(plan, reports[0][1]), optimizer=None, epoch=0, metrics={})
    resumed: list = []
    run_loop(plan, resumed, resume_dir=str(resume))
    assert [m["epoch"] for m, _ in resumed] == [1, 2] and resumed[0][0]["start_epoch"] == 1


def build(config, state):
    from include.models.tabular import build_model

    model = build_model(config)
    model.load_state_dict(state.model)
    return model


def seen_credentials(name: str) -> dict[str, str | None]:
    """What ``after_fit``'s function sees (called by import path in the specs below)."""
    import logging

    logging.getLogger("emr_ray.jobs.train").info("logged the model of %s", name)
    return {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}


def failing_step(name: str) -> None:
    raise RuntimeError(f"MLflow refused {name}")


def test_rank_0s_last_step_sees_the_jobs_credentials_only_during_its_call(monkeypatch):
    """The job's MLflow login reaches a warm worker with the call and leaves with it, even when the
    step fails: the worker outlives the job and serves other jobs next."""
    from emr_ray.jobs.train_group import TrainWorker

    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    worker = TrainWorker(0, 1, use_gpu=False)
    worker.call = "call-1"
    login = {"MLFLOW_TRACKING_USERNAME": "trainer", "MLFLOW_TRACKING_PASSWORD": "s3cret"}

    done = worker.after_fit("call-1", f"{__name__}:seen_credentials", {"name": "run-1"}, login)

    assert done["value"] == login
    assert any(line.endswith("logged the model of run-1") for line in done["log"])
    assert "MLFLOW_TRACKING_USERNAME" not in os.environ and "MLFLOW_TRACKING_PASSWORD" not in os.environ
    with pytest.raises(RuntimeError, match="MLflow refused run-1"):
        worker.after_fit("call-1", f"{__name__}:failing_step", {"name": "run-1"}, login)
    assert "MLFLOW_TRACKING_PASSWORD" not in os.environ
    with pytest.raises(RuntimeError, match="last ran call call-1"):  # never another job's call
        worker.after_fit("call-2", f"{__name__}:seen_credentials", {"name": "run-2"}, login)


def test_rank_0_logs_the_best_kept_checkpoint_and_if_it_dies_the_driver_logs_it_instead(tmp_path, plan):
    """After the loop, rank 0 is asked to log the best checkpoint (by the spec's score). If rank 0
    dies in that step, the loop's work is whole in the run's folder: the job goes on without rank 0's
    outcome, and ``fit_and_log`` logs that same checkpoint from the driver."""
    from pyarrow import fs as pafs

    from emr_ray.jobs.train_group import Rank0Lost
    from emr_ray.jobs.train_warm import FINISH, WarmTrainer
    from emr_ray.spec import TrainJobSpec
    from emr_ray.storage import StorageOptions

    spec = TrainJobSpec(
        train_loop="include.models.tabular:train_loop", datasets={"train": "file:///d/dt=2026-01-01"},
        run_name="r", storage_path=f"file://{tmp_path}/ckpt", checkpoint=CheckpointSpec(num_to_keep=1),
        mlflow={"tracking_uri": "http://127.0.0.1:1", "experiment_name": "e"}, worker_group="shared",
    )  # fmt: skip
    for epoch, loss in enumerate([0.5, 0.3, 0.4]):
        write_checkpoint(pafs.LocalFileSystem(), f"{tmp_path}/ckpt/r", tmp_path, epoch, loss)
    trainer = WarmTrainer(spec, plan[shards.PLAN_KEY], StorageOptions(), "run-1", {})
    asked: list = []

    def rank0_logs(fn, kwargs, env):
        asked.append((fn, kwargs["checkpoint_path"]))
        return {"champion": None}

    def rank0_dies(fn, kwargs, env):
        raise Rank0Lost("Warm worker group g: rank 0 died after the loop")

    logged = trainer._finish(rank0_logs)
    assert asked == [(FINISH, logged["kept"][0][0].path)] and int(logged["kept"][0][1]["epoch"]) == 1
    assert logged["finished"] == {"comparison": {"champion": None}}
    died = trainer._finish(rank0_dies)
    assert died["finished"] is None  # fit_and_log: the driver logs and compares
    assert int(died["kept"][0][1]["epoch"]) == 1 and int(died["latest"][1]["epoch"]) == 2
