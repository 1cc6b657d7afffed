"""The training job's own steps that need no cluster: plan, fingerprint, resume state."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from pyarrow import fs as pafs

from emr_ray.cluster import partitions, retention, storage
from emr_ray.cluster.jobs import train as job
from emr_ray.cluster.jobs._runtime import JobInputError
from emr_ray.cluster.spec import MLflowSection, ScalingSpec, TrainJobSpec


@pytest.fixture
def staged(tmp_path) -> partitions.Committed:
    """A committed partition with 7 train rows in one file and 3 test rows."""
    tables = {"train": pa.table({"x": list(range(7))}), "test": pa.table({"x": list(range(3))})}
    return partitions.write_tables(f"file://{tmp_path}/tabular/dt=2026-11-05", tables, {})


def spec_for(staged: partitions.Committed, **overrides) -> TrainJobSpec:
    fields = {
        "train_loop": "include.models.tabular:train_loop",
        "datasets": {name: staged.output_uri(name) for name in ("train", "test")},
        "run_name": "r",
        "storage_path": f"{staged.partition_uri}-checkpoints",
        "mlflow": MLflowSection(tracking_uri="sqlite:////tmp/unused.db", experiment_name="e"),
        "config": {"epochs": 2},
    }
    return TrainJobSpec(**(fields | overrides))


def test_the_plan_lists_every_file_with_its_rows_and_equal_shards_only_for_training(staged):
    spec = spec_for(staged)
    plan = job.plan_datasets(spec, spec.storage.options())
    assert [rows for _, rows in plan["datasets"]["train"]["files"]] == [7]
    assert plan["datasets"]["train"]["equal"] and not plan["datasets"]["test"]["equal"]
    assert job.planned_rows(plan, spec) == {"train": 7, "test": 3}


def test_more_workers_than_training_rows_is_refused_with_the_fix(staged):
    spec = spec_for(staged, scaling=ScalingSpec(num_workers=8))
    plan = job.plan_datasets(spec, spec.storage.options())
    with pytest.raises(JobInputError, match="7 rows for 8 workers; use fewer workers"):
        job.planned_rows(plan, spec)


def test_the_fingerprint_changes_with_config_and_data_and_nothing_else(staged):
    spec = spec_for(staged)
    manifests = job.input_manifests(spec, spec.storage.options())
    assert manifests["train"]["generation"] == staged.generation
    same = job.fingerprint(spec_for(staged), manifests)
    assert job.fingerprint(spec, manifests) == same
    assert job.fingerprint(spec_for(staged, config={"epochs": 3}), manifests) != same
    rerun = partitions.write_tables(staged.partition_uri, {"train": pa.table({"x": list(range(7))})}, {})
    assert (
        job.fingerprint(
            spec, manifests | {"train": {"generation": rerun.generation, "digest": rerun.digest()}}
        )
        != same
    )


def test_a_stored_run_is_kept_for_the_same_inputs_and_cleared_for_others(tmp_path):
    run_state = job.RunState(pafs.LocalFileSystem(), str(tmp_path / "run"))
    run_state.write({"fingerprint": "a", "mlflow_run_id": "m1"})
    spec = spec_for(
        partitions.write_tables(f"file://{tmp_path}/p/dt=2026-11-05", {"train": pa.table({"x": [1]})}, {})
    )
    assert job.resume_state(spec, run_state, "a") == {"fingerprint": "a", "mlflow_run_id": "m1"}
    assert job.resume_state(spec, run_state, "b") == {}
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("stored", [b'{"fingerprint": "a", "mlflow_ru', b"\xff\xfe", b"[1, 2]"])
def test_an_unreadable_stored_run_is_kept_aside_and_the_run_starts_clean(tmp_path, stored):
    """A state file cut short by a crash (or not JSON, or not an object) would fail every retry,
    force_recompute included: it is copied beside the run's folder and the run starts clean."""
    run_state = job.RunState(pafs.LocalFileSystem(), str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / job.STATE_FILE).write_bytes(stored)
    (tmp_path / "run" / "checkpoint_epoch_000001").mkdir()  # of inputs nobody can vouch for now
    spec = spec_for(
        partitions.write_tables(f"file://{tmp_path}/p/dt=2026-11-05", {"train": pa.table({"x": [1]})}, {})
    )
    assert job.resume_state(spec, run_state, "a") == {}
    assert not (tmp_path / "run").exists()
    (kept,) = tmp_path.glob(f"run.unreadable-*-{job.STATE_FILE}")
    assert kept.read_bytes() == stored


def test_a_run_of_new_inputs_waits_for_an_abandoned_call_before_it_clears_the_run_folder(staged, monkeypatch):
    """Issue 31, item 6: a killed job's warm call may still write checkpoints of the old inputs into
    the run's folder. The wait for it comes first, the clear after: nothing it wrote survives for
    the new inputs' run to resume from."""
    from pathlib import Path

    import ray

    from emr_ray.cluster.jobs import train_group
    from emr_ray.cluster.jobs import train_mlflow as tracking

    spec = spec_for(staged)
    run_dir = Path(spec.storage_path.removeprefix("file://")) / spec.run_name
    run_state = job.RunState(pafs.LocalFileSystem(), str(run_dir))
    run_state.write({"fingerprint": "of-the-old-inputs", "mlflow_run_id": "m1"})
    waited_with = []

    def abandoned_call_writes_on(run_uri: str) -> list[str]:
        waited_with.append(run_state.read().get("fingerprint"))
        (run_dir / "checkpoint_epoch_000007").mkdir(parents=True)  # its last checkpoint, old data
        return ["warm-group-1"]

    class Started(Exception):
        """Where the test stops: the run is about to start training."""

    def start_run(spec, resuming, run_inputs=()):
        raise Started(resuming)

    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # the job sets it: restored after
    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    monkeypatch.setattr(train_group, "wait_for_abandoned_calls", abandoned_call_writes_on)
    monkeypatch.setattr(tracking, "start_run", start_run)
    with pytest.raises(Started) as started:
        job.run(spec)
    assert waited_with == ["of-the-old-inputs"]  # it waited before touching the folder
    assert started.value.args == (None,)  # a new MLflow run, not the old inputs' one
    assert not run_dir.exists() or not any(run_dir.iterdir())  # the old inputs' folder: cleared whole


def test_a_pin_that_cannot_be_written_fails_the_training_with_the_fix_and_a_rerun_keeps_its_run(staged):
    """Storage the training may not write under ``_pins/`` (here a file where the folder goes: this
    runs as root, which file modes do not stop) fails the job as an input error naming what to grant."""
    spec = spec_for(staged)
    options = spec.storage.options()
    inputs = job.resolve_inputs(spec, options)
    job.pin_inputs(spec, inputs, options, "run-1")
    job.pin_inputs(spec, inputs, options)  # a reused training: its pin keeps the run id
    assert {p.mlflow_run_id for p in retention.pins(staged.partition_uri)} == {"run-1"}

    root = storage.split_uri(staged.partition_uri)[1]
    blocked = f"{root}/{partitions.PINS}"
    shutil.rmtree(blocked)
    with open(blocked, "w") as f:
        f.write("not a folder")
    with pytest.raises(JobInputError, match=r"give the training's storage keys write access under .*/_pins/"):
        job.pin_inputs(spec, inputs, options, "run-1")
