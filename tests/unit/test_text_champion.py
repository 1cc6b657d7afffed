"""The training job's champion comparison with the text module (plugins/emr_ray/cluster/jobs/compare.py driving
include/models/text.py): the new model and a champion from another generation, with another
vocabulary, each scored on the same raw test rows through its own vocabulary.

Real MLflow SQLite store and Parquet files in a temporary folder, as ``tests/unit/jobs/test_serving_model.py``.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from emr_ray.cluster.jobs import compare, shards
from emr_ray.cluster.spec import CompareSection, MLflowSection, TrainJobSpec
from include.models import text as model_module
from include.preprocessing.text import token_ids
from tests.unit.test_text_model import CONFIG, VOCAB, sentiment_weights

# the champion's day numbered the tokens the other way round (its weights follow its numbering)
OLD_VOCAB = {"good": 7, "bad": 6, "not": 5, "not_good": 4, "not_bad": 3, "the": 2}
TEXTS = ["the good", "not good", "bad", "not bad", "the not bad", "good"]


def dataset(root, name: str, table: pa.Table) -> dict:
    folder = root / "dt=2026-11-05" / name
    os.makedirs(folder, exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet")
    return shards.describe(folder.as_uri(), [(str(folder / "part-0.parquet"), table.num_rows)], equal=False)


@pytest.fixture
def plan(tmp_path) -> dict:
    """Today's generation: its vocabulary, and test rows with the raw text and today's token ids."""
    vocab = pa.table({"token": list(VOCAB), "id": pa.array(list(VOCAB.values()), pa.int64())})
    test = pa.table({"doc_id": [f"d{i}" for i in range(len(TEXTS))], "text": TEXTS,
                     "label": pa.array([1, 0, 0, 1, 1, 1], pa.int64()),
                     "tokens": pa.array([token_ids(t, VOCAB) for t in TEXTS], pa.list_(pa.int64()))})  # fmt: skip
    return {"datasets": {"vocab": dataset(tmp_path, "vocab", vocab), "test": dataset(tmp_path, "test", test)}}


@pytest.fixture
def spec(tmp_path, new_sqlite_store) -> TrainJobSpec:
    import mlflow

    store = new_sqlite_store(tmp_path)
    mlflow.MlflowClient(store).create_experiment("text", artifact_location=(tmp_path / "artifacts").as_uri())
    return TrainJobSpec(
        train_loop="include.models.text:train_loop",
        datasets={name: f"file:///d/dt=2026-11-05/{name}" for name in ("train", "test", "vocab")},
        run_name="r",
        storage_path="file:///unused",
        mlflow=MLflowSection(tracking_uri=store, experiment_name="text"),
        config=CONFIG,
        compare=CompareSection(model_name="text-sentiment"),
    )


def make_champion(spec: TrainJobSpec, python_model, example) -> None:
    """Log a serving model as the training job does, register it, make it the champion."""
    import mlflow

    client = mlflow.MlflowClient(spec.mlflow.tracking_uri)
    run = client.create_run(client.get_experiment_by_name("text").experiment_id)
    mlflow.set_tracking_uri(spec.mlflow.tracking_uri)
    try:
        with mlflow.start_run(run_id=run.info.run_id):
            info = mlflow.pyfunc.log_model(name="model", python_model=python_model, input_example=example,
                                           pip_requirements=["torch"])  # fmt: skip
        version = mlflow.register_model(info.model_uri, "text-sentiment").version
    finally:
        mlflow.set_tracking_uri("")
    client.set_registered_model_alias("text-sentiment", "champion", str(version))


def test_champion_and_new_model_are_each_scored_through_their_own_vocabulary(spec, plan):
    import mlflow

    table = pa.table({"token": list(OLD_VOCAB), "id": pa.array(list(OLD_VOCAB.values()), pa.int64())})
    old, example = model_module.serving_model(sentiment_weights(OLD_VOCAB), CONFIG, lambda name: table)
    make_champion(spec, old, example)
    challenger = compare.as_scored(spec, sentiment_weights(VOCAB), plan, None)
    assert isinstance(challenger, model_module.TextSentimentModel) and challenger.vocab == VOCAB

    run = mlflow.MlflowClient(spec.mlflow.tracking_uri).create_run("1").info.run_id
    figures = compare.with_champion(spec, plan, None, run, challenger)
    assert figures.champion_version == "1" and figures.rows == len(TEXTS)
    assert figures.champion["test_accuracy"] == 1.0  # today's token ids would have misled it
    assert figures.challenger["test_accuracy"] == 1.0


def test_read_through_todays_ids_the_champion_would_be_wrong(plan):
    """Why the raw text must travel with the test rows: the old weights on today's ids misread them."""
    table = compare.read_test_rows(plan, None)
    assert model_module.evaluate(sentiment_weights(OLD_VOCAB), CONFIG, table)["test_accuracy"] < 0.7
