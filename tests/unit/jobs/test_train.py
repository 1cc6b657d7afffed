"""The training job's own steps that need no cluster: plan, fingerprint, resume state."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from emr_ray import storage
from emr_ray.jobs import train as job
from emr_ray.jobs._runtime import JobInputError
from emr_ray.spec import MLflowSection, ScalingSpec, TrainJobSpec


@pytest.fixture
def staged(tmp_path) -> str:
    """A committed partition with 7 train rows in two files and 3 test rows."""
    final = f"file://{tmp_path}/tabular/dt=2026-11-05"
    tmp = storage.staging_uri(final)
    root = storage.split_uri(tmp)[1]
    for name, sizes in {"train": [4, 3], "test": [3]}.items():
        for i, rows in enumerate(sizes):
            os.makedirs(f"{root}/{name}", exist_ok=True)
            pq.write_table(pa.table({"x": list(range(rows))}), f"{root}/{name}/part-{i}.parquet")
    storage.commit(tmp, final, {"outputs": {"train": {"rows": 7}, "test": {"rows": 3}}})
    return final


def spec_for(staged: str, **overrides) -> TrainJobSpec:
    fields = {
        "train_loop": "include.models.tabular:train_loop",
        "datasets": {"train": f"{staged}/train", "test": f"{staged}/test"},
        "run_name": "r",
        "storage_path": f"{staged}-checkpoints",
        "mlflow": MLflowSection(tracking_uri="sqlite:////tmp/unused.db", experiment_name="e"),
        "config": {"epochs": 2},
    }
    return TrainJobSpec(**(fields | overrides))


def test_the_plan_lists_every_file_with_its_rows_and_equal_shards_only_for_training(staged):
    spec = spec_for(staged)
    plan = job.plan_datasets(spec, spec.storage.options())
    assert [rows for _, rows in plan["datasets"]["train"]["files"]] == [4, 3]
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
    assert manifests == {"train": 7, "test": 3}
    same = job.fingerprint(spec_for(staged), manifests)
    assert job.fingerprint(spec, manifests) == same
    assert job.fingerprint(spec_for(staged, config={"epochs": 3}), manifests) != same
    assert job.fingerprint(spec, manifests | {"train": 8}) != same


def test_a_stored_run_is_kept_for_the_same_inputs_and_cleared_for_others(tmp_path):
    run_state = job.RunState(pafs.LocalFileSystem(), str(tmp_path / "run"))
    run_state.write({"fingerprint": "a", "mlflow_run_id": "m1"})
    spec = spec_for(f"file://{tmp_path}/p")
    assert job.resume_state(spec, run_state, "a") == {"fingerprint": "a", "mlflow_run_id": "m1"}
    assert job.resume_state(spec, run_state, "b") == {}
    assert not (tmp_path / "run").exists()
