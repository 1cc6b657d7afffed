"""The warm training worker group without a cluster (``emr_ray.cluster.jobs.train_group``,
``train_checkpoints``): which trainings may share a group, how a run's checkpoints are kept and
found, and the project's loop running in a warm worker's context (``emr_ray.cluster.train.WarmGroupContext``), in
this process with torch and real Parquet files. On a real cluster: ``tests/integration/test_train_group.py``.
"""

from __future__ import annotations

import json
import os

import pytest

from emr_ray.cluster import train as emr_train
from emr_ray.cluster.jobs import shards, train_checkpoints
from emr_ray.cluster.jobs.train_checkpoints import CheckpointStore
from emr_ray.cluster.jobs.train_group import NAME_PREFIX, group_key
from emr_ray.cluster.spec import CheckpointSpec, ScalingSpec

SCALING = ScalingSpec(num_workers=2).to_dict()
JOB_ENV = {
    "py_modules": ["gcs://_ray_pkg_emr_ray_0123abcd.zip"],
    "env_vars": {"PYTHONPATH": "/srv/project", "EMR_RAY_SECRETS_REF": "gcs://_emr_ray_secrets_x.zip"},
}


def test_trainings_with_the_same_scaling_and_code_share_a_group_whatever_their_secrets():
    from emr_ray.cluster.warm.keys import pool_runtime_env

    other_secret = {**JOB_ENV, "env_vars": {**JOB_ENV["env_vars"], "EMR_RAY_SECRETS_REF": "gcs://y.zip"}}
    one, two = (
        group_key(SCALING, pool_runtime_env(JOB_ENV)),
        group_key(SCALING, pool_runtime_env(other_secret)),
    )
    assert one == two and one.startswith(NAME_PREFIX)
    assert group_key(ScalingSpec(num_workers=3).to_dict(), pool_runtime_env(JOB_ENV)) != one
    assert group_key(SCALING, pool_runtime_env(JOB_ENV | {"py_modules": ["gcs://_ray_pkg_other.zip"]})) != one


def test_the_worker_group_mode_is_checked_when_the_spec_is_built():
    from emr_ray.cluster.spec import TrainJobSpec

    with pytest.raises(ValueError, match=r"worker_group='warm': use 'job' .* or 'shared'"):
        TrainJobSpec(
            train_loop="include.models.tabular:train_loop", datasets={"train": "file:///d/dt=2026-01-01"},
            run_name="r", storage_path="file:///c", mlflow={"tracking_uri": "http://127.0.0.1:1", "experiment_name": "e"},
            worker_group="warm",
        )  # fmt: skip


def write_checkpoint(
    fsys, run_path: str, tmp_path, epoch: int, loss: float | None, *, complete=True, inputs: str | None = None
) -> str:
    local = tmp_path / f"local-{epoch}"
    local.mkdir()
    (local / emr_train.STATE_FILE).write_bytes(b"weights")
    if inputs:
        (local / emr_train.INPUTS_FILE).write_text(json.dumps({"fingerprint": inputs}))
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


def test_a_checkpoint_with_a_truncated_metrics_file_counts_as_incomplete(tmp_path):
    """Issue 31, item 7: the warm path resumes from the previous whole checkpoint, never fails on it."""
    from pyarrow import fs as pafs

    fsys, run_path = pafs.LocalFileSystem(), str(tmp_path / "run")
    for epoch in (0, 1):
        write_checkpoint(fsys, run_path, tmp_path, epoch, 0.5)
    with open(os.path.join(run_path, train_checkpoints.directory_name(1), emr_train.METRICS_FILE), "w") as f:
        f.write('{"epoch": 1, "test_lo')
    store = CheckpointStore(fsys, run_path, CheckpointSpec(num_to_keep=None, score_attribute="test_loss"))
    assert int(store.latest()[1]["epoch"]) == 0


def test_a_store_of_one_runs_inputs_ignores_checkpoints_of_other_inputs(tmp_path):
    """Issue 31, item 6: checkpoints carry the fingerprint of their inputs; the warm path's store
    (resume, best, retention) sees only its run's own."""
    from pyarrow import fs as pafs

    fsys, run_path = pafs.LocalFileSystem(), str(tmp_path / "run")
    for epoch, loss in enumerate([0.9, 0.4]):
        write_checkpoint(fsys, run_path, tmp_path, epoch, loss, inputs="fp-a")
    write_checkpoint(fsys, run_path, tmp_path, 2, 0.1, inputs="fp-b")  # a better loss, on other data
    write_checkpoint(fsys, run_path, tmp_path, 3, 0.2)  # names no inputs
    spec = CheckpointSpec(num_to_keep=1, score_attribute="test_loss")
    mine = CheckpointStore(fsys, run_path, spec, inputs="fp-a")
    assert int(mine.latest()[1]["epoch"]) == 1 and int(mine.ranked()[0][1]["epoch"]) == 1
    assert [int(m["epoch"]) for _, m in mine.retain()] == [1]
    assert int(CheckpointStore(fsys, run_path, spec).latest()[1]["epoch"]) == 3  # without inputs: every one


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

    from emr_ray.cluster.storage import StorageOptions
    from include.models.tabular import train_loop

    def report(metrics, directory):
        state = emr_train.load_state(directory) if directory else None
        reports.append((metrics, state))

    context = emr_train.WarmGroupContext(0, 1, torch.device("cpu"), StorageOptions(), resume_dir, report)
    with emr_train.running_in(context):
        train_loop(config)
    assert isinstance(emr_train.get_context(), emr_train.RayTrainContext)  # Ray Train's again after the call


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
    """What ``after_fit``'s function sees."""
    import logging

    logging.getLogger("emr_ray.cluster.jobs.train").info("logged the model of %s", name)
    return {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}


def failing_step(name: str) -> None:
    raise RuntimeError(f"MLflow refused {name}")


def test_rank_0s_last_step_sees_the_jobs_credentials_only_during_its_call(monkeypatch):
    """The job's MLflow login reaches a warm worker with the call and leaves with it, even when the
    step fails: the worker outlives the job and serves other jobs next."""
    from emr_ray.cluster.jobs.train_group import TrainWorker

    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    worker = TrainWorker(0, 1, use_gpu=False)
    worker.call = "call-1"
    login = {"MLFLOW_TRACKING_USERNAME": "trainer", "MLFLOW_TRACKING_PASSWORD": "s3cret"}

    done = worker.after_fit("call-1", seen_credentials, {"name": "run-1"}, login)

    assert done.value == login
    assert any(line.endswith("logged the model of run-1") for line in done.log)
    assert "MLFLOW_TRACKING_USERNAME" not in os.environ and "MLFLOW_TRACKING_PASSWORD" not in os.environ
    with pytest.raises(RuntimeError, match="MLflow refused run-1"):
        worker.after_fit("call-1", failing_step, {"name": "run-1"}, login)
    assert "MLFLOW_TRACKING_PASSWORD" not in os.environ
    with pytest.raises(RuntimeError, match="last ran call call-1"):  # never another job's call
        worker.after_fit("call-2", seen_credentials, {"name": "run-2"}, login)
    # the run's other steps (its start, each epoch), beside the loop: the same login, for the call only
    assert worker.mlflow_step(seen_credentials, {"name": "run-1"}, login) == login
    assert "MLFLOW_TRACKING_USERNAME" not in os.environ and "MLFLOW_TRACKING_PASSWORD" not in os.environ


def warm_spec(tmp_path):
    from emr_ray.cluster.spec import MLflowSection, TrainJobSpec

    return TrainJobSpec(
        train_loop="include.models.tabular:train_loop", datasets={"train": "file:///d/dt=2026-01-01"},
        run_name="r", storage_path=f"file://{tmp_path}/ckpt", checkpoint=CheckpointSpec(num_to_keep=1),
        mlflow=MLflowSection(tracking_uri="http://127.0.0.1:1", experiment_name="e"), worker_group="shared",
        config={"epochs": 3},
    )  # fmt: skip


def test_rank_0_logs_the_best_kept_checkpoint_ends_the_run_and_if_it_dies_the_driver_does(tmp_path, plan):
    """After the loop, rank 0 is asked to log the best checkpoint (by the spec's score), then to end
    the run with the last epoch's metrics. If rank 0 dies in that step, the loop's work is whole in the
    run's folder: the job goes on without rank 0's outcome, and ``fit_and_log`` logs that same
    checkpoint and ends the run from the driver."""
    from pyarrow import fs as pafs

    from emr_ray.cluster.jobs import train_finish, train_mlflow
    from emr_ray.cluster.jobs.train_group import Rank0Lost
    from emr_ray.cluster.jobs.train_warm import LastStep, WarmTrainer
    from emr_ray.cluster.results import ChampionScores
    from emr_ray.cluster.storage import StorageOptions

    for epoch, loss in enumerate([0.5, 0.3, 0.4]):
        write_checkpoint(pafs.LocalFileSystem(), f"{tmp_path}/ckpt/r", tmp_path, epoch, loss)
    trainer = WarmTrainer(warm_spec(tmp_path), plan[shards.PLAN_KEY], StorageOptions(), {})
    trainer.mlflow_run_id = "run-1"
    trainer.last = {"epoch": 2, "test_loss": 0.4, "note": "not a number"}
    asked: list = []

    scores = ChampionScores(model_name="tabular-mlp", alias="champion")  # no champion yet

    class Rank0Logs:
        def after_fit(self, fn, kwargs, env):
            asked.append((fn, kwargs))
            return scores if fn is train_finish.log_and_compare_stored else None

    class Rank0Dies:
        def after_fit(self, fn, kwargs, env):
            raise Rank0Lost("Warm worker group g: rank 0 died after the loop")

    logged = trainer.after_loop(Rank0Logs())  # type: ignore[arg-type]
    assert [fn for fn, _ in asked] == [train_finish.log_and_compare_stored, train_mlflow.end_run]
    assert asked[0][1]["checkpoint_path"] == logged.best_checkpoints[0][0].path
    assert int(logged.best_checkpoints[0][1]["epoch"]) == 1
    assert asked[1][1]["mlflow_run_id"] == "run-1" and asked[1][1]["final"] == {"epoch": 2, "test_loss": 0.4}
    assert logged.finished == LastStep(scores, ended=True)
    died = trainer.after_loop(Rank0Dies())  # type: ignore[arg-type]
    assert died.finished is None  # fit_and_log: the driver logs, compares and ends the run
    assert int(died.best_checkpoints[0][1]["epoch"]) == 1 and died.checkpoint is not None
    assert died.metrics == trainer.last


def test_a_warm_trainings_driver_imports_no_mlflow(tmp_path, plan):
    """Every MLflow step of a warm training runs on the group's rank 0: the run's start (whose id the
    driver records before the loop), each epoch, the model, the end and, after the lease, the usage.
    In a fresh interpreter, as a job's driver is, the warm path's steps (``fit_shared`` stood in for by
    a function that calls them as the real one does, and rank 0 by a recorder) import no MLflow."""
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    script.write_text(DRIVER_SCRIPT)
    (tmp_path / "plan.json").write_text(json.dumps(plan[shards.PLAN_KEY]))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=os.getcwd())  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["steps"] == ["begin_run", "log_epoch_metrics", "log_epoch_metrics", "log_and_compare_stored",
                            "end_run"]  # fmt: skip
    assert out["recorded_run"] == "run-7" and out["mlflow_imported"] is False
    assert "[emr_ray] epoch 2/3" in done.stdout  # the driver prints each epoch's line


DRIVER_SCRIPT = """
import json, sys
from pyarrow import fs as pafs
from emr_ray.cluster.jobs import train, train_group, train_warm
from emr_ray.cluster.results import PoolUse
from emr_ray.cluster.spec import CheckpointSpec, TrainJobSpec
from emr_ray.cluster.storage import StorageOptions
from emr_ray.cluster.warm.lease import PoolCall
from tests.unit.jobs.test_train_group import warm_spec, write_checkpoint
import pathlib

tmp = pathlib.Path(sys.argv[1])
plan = json.loads((tmp / "plan.json").read_text())
spec = warm_spec(tmp)
steps, recorded = [], []

class Rank0Call:  # the group call as the callback sees it: rank 0's steps, recorded
    rank0 = None

    def step(self, fn, kwargs, env):
        steps.append(fn.__name__)
        return "run-7" if fn.__name__ == "begin_run" else None

    def after_fit(self, fn, kwargs, env):
        steps.append(fn.__name__)
        return {"champion": None} if fn.__name__ == "log_and_compare_stored" else None

def fit_shared(train_loop, config, scaling, options, run_uri, callback, **kwargs):
    callback.before_loop(Rank0Call())
    for epoch in range(2):
        write_checkpoint(pafs.LocalFileSystem(), f"{tmp}/ckpt/r", tmp, epoch, 0.5 - epoch / 10)
        callback.on_report({"metrics": {"epoch": epoch, "test_loss": 0.5 - epoch / 10}, "checkpoint": "stored"})
    use = PoolUse(name="g", calls=2, reused=True, why=None, start_seconds=1.0, idle_seconds=3.0, age_seconds=60.0)
    return PoolCall(value=callback.after_loop(Rank0Call()), use=use, described="Warm worker group g: call 2 (warm)",
                    resources={"CPU": 2.0, "GPU": 0.0}, started_at=0.0, ended_at=1.0)

train_group.fit_shared = fit_shared
trainer = train_warm.WarmTrainer(spec, plan, StorageOptions(), {}, on_run_started=recorded.append)
fitted = train.fit_and_log(trainer, spec, plan, StorageOptions(), None)
print(json.dumps({"steps": steps, "recorded_run": recorded[0], "mlflow_imported": "mlflow" in sys.modules}))
"""


class Rank0:
    """A stand-in for rank 0's actor handle: each step's outcome as given (``ray.get`` is the identity)."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome

    def __getattr__(self, name: str):
        return self

    def options(self, **_):
        return self

    def remote(self, *args):
        return self.outcome


def test_a_call_whose_rank_0_dies_retires_the_group_and_the_jobs_own_step_errors_do_not(monkeypatch):
    """Rank 0 lost beside the loop (GroupFailed: the job restarts in a fresh group) or after it
    (Rank0Lost: the driver does the last step) retires the group when the lease ends; a step that
    fails on its own (MLflow refused) leaves the group sound."""
    import ray
    from ray.exceptions import ActorDiedError

    from emr_ray.cluster.jobs.train_group import GroupCall, GroupFailed, Rank0Lost
    from emr_ray.cluster.warm.actor import Grant, PoolFigures
    from emr_ray.cluster.warm.call_log import Ran
    from emr_ray.cluster.warm.lease import Replica

    def get(value, **_):
        if isinstance(value, BaseException):
            raise value
        return value

    monkeypatch.setattr(ray, "get", get)

    def call(outcome) -> GroupCall:
        grant = Grant(lease="l", calls=0, start_seconds=1.0, figures=PoolFigures(workers=(Rank0(outcome),)))
        return GroupCall(Replica("train-x-0", None, grant))

    refused = call(PermissionError("MLflow refused the login"))
    with pytest.raises(PermissionError, match="MLflow refused"):
        refused.step(print, {}, {})
    assert refused.group.sound
    done = call(Ran(7, ["logged"]))
    assert done.after_fit(print, {}, {}) == 7 and done.log == ["logged"] and done.group.sound
    beside, after = call(ActorDiedError()), call(ActorDiedError())
    with pytest.raises(GroupFailed, match="train-x-0: rank 0 died"):
        beside.step(print, {}, {})
    with pytest.raises(Rank0Lost, match="rank 0 died after the loop"):
        after.after_fit(print, {}, {})
    assert not beside.group.sound and not after.group.sound
    hung = call(ray.exceptions.GetTimeoutError())  # an MLflow that never answers: bounded, then retired
    with pytest.raises(GroupFailed, match="rank 0 did not answer in 600s"):
        hung.step(print, {}, {})
    assert not hung.group.sound
