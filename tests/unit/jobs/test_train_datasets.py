"""What MLflow itself shows of a training's data (``emr_ray.cluster.jobs.train_datasets``): a real
MLflow SQLite store and a partition committed on ``file://``, described as the training job does.
On the live stack, both ways a run starts (the job's driver, a warm group's rank 0):
``tests/integration/test_train_group.py``."""

from __future__ import annotations

import json

import pyarrow as pa

from emr_ray.cluster import partitions
from emr_ray.cluster.jobs import train as job
from emr_ray.cluster.jobs import train_datasets
from emr_ray.cluster.jobs import train_mlflow as tracking
from emr_ray.cluster.spec import MLflowSection, TrainJobSpec


def test_a_training_run_lists_its_generations_as_mlflow_datasets_and_the_rows_both_models_were_scored_on(
    tmp_path, new_sqlite_store
):
    import mlflow

    tables = {
        "train": pa.table({"f0": [0.5] * 7, "label": pa.array([1] * 7, pa.int64())}),
        "test": pa.table({"f0": [0.1] * 3, "label": pa.array([0] * 3, pa.int64())}),
    }
    staged = partitions.write_tables(f"file://{tmp_path}/tabular/dt=2026-11-05", tables, {})
    store = new_sqlite_store(tmp_path)
    spec = TrainJobSpec(
        train_loop="include.models.tabular:train_loop",
        datasets={name: staged.output_uri(name) for name in tables},
        run_name="r",
        storage_path=f"{staged.partition_uri}-checkpoints",
        mlflow=MLflowSection(tracking_uri=store, experiment_name="e"),
    )
    options = spec.storage.options()
    inputs = job.resolve_inputs(spec, options)
    plan = job.plan_datasets(spec, options, inputs)
    plan[train_datasets.PLAN_KEY] = [item.to_dict() for item in train_datasets.describe(inputs, plan)]

    run_id = tracking.start_run(spec, None, train_datasets.of_plan(plan))
    client = mlflow.MlflowClient(store)
    shown = {item.dataset.name: item for item in client.get_run(run_id).inputs.dataset_inputs}
    assert sorted(shown) == ["test", "train"]
    for name, context, rows in (("train", "training", 7), ("test", "testing", 3)):
        dataset = shown[name].dataset
        assert dataset.digest == staged.digest()  # the generation's files and checksums
        assert json.loads(dataset.source) == {"uri": staged.output_uri(name), "generation": staged.generation}
        assert json.loads(dataset.profile) == {"num_rows": rows}
        assert [(c["name"], c["type"]) for c in json.loads(dataset.schema)["mlflow_colspec"]] == [
            ("f0", "double"),
            ("label", "long"),
        ]
        assert {t.key: t.value for t in shown[name].tags} == {"mlflow.data.context": context}

    tracking.start_run(spec, run_id, train_datasets.of_plan(plan))  # a resumed run: nothing doubled
    assert len(client.get_run(run_id).inputs.dataset_inputs) == 2

    train_datasets.log_compared_rows(client, run_id, plan, "tabular-mlp", "3", 3)
    compared = {item.dataset.name: item for item in client.get_run(run_id).inputs.dataset_inputs}
    scored = compared["test scored with tabular-mlp v3"]
    assert scored.dataset.digest == shown["test"].dataset.digest  # the same rows, visibly
    assert {t.key: t.value for t in scored.tags} == {
        "mlflow.data.context": "evaluation",
        "emr_ray.compare.champion": "tabular-mlp v3",
        "emr_ray.compare.rows": "3",
    }
