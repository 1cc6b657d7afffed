"""A training module with ``serving_model``: the job logs its Python model (vocabulary inside), and the
champion comparison scores the new and the champion's Python models, each through its own vocabulary.

Real MLflow SQLite store and real Parquet files in a temporary folder; ``tests/unit/jobs/word_model.py``
is the module (one word in, one class out).
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from emr_ray.cluster.jobs import compare, shards
from emr_ray.cluster.spec import CompareSection, MLflowSection, TrainJobSpec
from tests.unit.jobs import word_model

WORDS = ["good", "bad", "great", "awful"]


def dataset(root, name: str, table: pa.Table) -> dict:
    folder = root / "dt=2026-11-05" / name
    os.makedirs(folder, exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet")
    return shards.describe(folder.as_uri(), [(str(folder / "part-0.parquet"), table.num_rows)], equal=False)


@pytest.fixture
def plan(tmp_path) -> dict:
    """A generation with a vocabulary (ids 1..4) and test rows that keep the raw word."""
    vocab = pa.table({"word": WORDS, "id": pa.array([1, 2, 3, 4], pa.int64())})
    test = pa.table({"word": WORDS * 3, "word_id": pa.array([1, 2, 3, 4] * 3, pa.int64()),
                     "label": pa.array([1, 0, 1, 0] * 3, pa.int64())})  # fmt: skip
    datasets = {"vocab": dataset(tmp_path, "vocab", vocab), "test": dataset(tmp_path, "test", test)}
    return {"datasets": datasets, "storage": {}}


@pytest.fixture
def spec(tmp_path, new_sqlite_store) -> TrainJobSpec:
    import mlflow

    store = new_sqlite_store(tmp_path)
    mlflow.MlflowClient(store).create_experiment(
        "serving", artifact_location=(tmp_path / "artifacts").as_uri()
    )
    return TrainJobSpec(
        train_loop="tests.unit.jobs.word_model:train_loop",
        datasets={"train": "file:///d/dt=2026-11-05/train", "test": "file:///d/dt=2026-11-05/test"},
        run_name="r",
        storage_path="file:///unused",
        mlflow=MLflowSection(tracking_uri=store, experiment_name="serving"),
        config=word_model.CONFIG,
        compare=CompareSection(model_name="words"),
    )


def perfect(flip: bool = False):
    """An embedding that classifies ids 1, 3 as class 1 and 2, 4 as class 0 (or the other way round)."""
    model = word_model.build_model(word_model.CONFIG)
    with torch.no_grad():
        model.weight.zero_()
        for word_id in (1, 2, 3, 4):
            positive = word_id % 2 == 1
            model.weight[word_id, int(positive != flip)] = 5.0
    return model


def log_champion(spec: TrainJobSpec, python_model, example) -> None:
    """Log a Python model as the training job does, register it, make it the champion."""
    import mlflow

    client = mlflow.MlflowClient(spec.mlflow.tracking_uri)
    run = client.create_run(client.get_experiment_by_name("serving").experiment_id)
    mlflow.set_tracking_uri(spec.mlflow.tracking_uri)
    try:
        with mlflow.start_run(run_id=run.info.run_id):
            info = mlflow.pyfunc.log_model(name="model", python_model=python_model, input_example=example,
                                           pip_requirements=["torch"])  # fmt: skip
        version = mlflow.register_model(info.model_uri, "words").version
    finally:
        mlflow.set_tracking_uri("")
    client.set_registered_model_alias("words", "champion", str(version))


def test_the_new_model_is_scored_as_its_serving_model_with_this_generations_vocabulary(spec, plan):
    scored = compare.as_scored(spec, perfect(), plan, options=None)
    assert isinstance(scored, word_model.WordModel)
    assert scored.vocab == {"good": 1, "bad": 2, "great": 3, "awful": 4}
    assert (
        word_model.evaluate(scored, spec.config, compare.read_test_rows(plan, None))["test_accuracy"] == 1.0
    )


def test_a_champion_with_another_vocabulary_is_scored_through_its_own(spec, plan):
    # the champion's generation numbered the words the other way round, and its weights match that numbering
    swapped = word_model.WordModel(perfect(flip=True).state_dict(), {"good": 2, "bad": 1, "great": 4, "awful": 3},
                                   word_model.CONFIG)  # fmt: skip
    log_champion(spec, swapped, None)
    run = __import__("mlflow").MlflowClient(spec.mlflow.tracking_uri).create_run("1").info.run_id
    figures = compare.with_champion(spec, plan, None, run, compare.as_scored(spec, perfect(), plan, None))
    assert figures.champion_version == "1" and figures.rows == 12
    assert figures.champion["test_accuracy"] == 1.0  # right through its own vocabulary
    assert figures.challenger["test_accuracy"] == 1.0


def test_a_dataset_the_training_does_not_have_is_named_with_the_fix(plan):
    with pytest.raises(ValueError, match="No dataset 'items'.*pass it in the training operator's datasets"):
        shards.dataset_reader(plan, None)("items")
