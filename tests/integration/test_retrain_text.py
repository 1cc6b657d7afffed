"""The text DAG end to end through ``airflow dags test``: Spark on Ray tokenises the day's reviews and
builds the vocabulary, Ray Train fits the classifier, MLflow logs it with its vocabulary as a model that
takes raw text and registers ``text-sentiment`` as champion. Real Airflow, Ray, RayDP, MLflow and COS
stand-in, as in ``test_retrain_digits``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from emr_ray.cluster import partitions, storage
from include.preprocessing.text import token_ids
from tests.fixtures.pipeline import GOOD, TEXT_ROWS, TRICKY_REVIEWS

pytestmark = pytest.mark.integration

ROWS, TRICKY = TEXT_ROWS, TRICKY_REVIEWS


@pytest.fixture(scope="module")
def run(workload_runs):
    """``dags test retrain_text`` on the day's generated reviews plus a second file of tricky ones."""
    return workload_runs["retrain_text"]


@pytest.fixture(scope="module")
def staged(stack, run):
    """The committed generation's train, test and vocab tables."""
    committed = partitions.require_current(storage.join(stack.staging_uri, "text", f"dt={GOOD}"))
    fsys, _ = storage.resolve(committed.partition_uri)
    return committed.manifest, {
        name: pa.concat_tables(pq.read_table(path, filesystem=fsys) for path, _ in partitions.dataset_files(committed, name))
        for name in ("train", "test", "vocab")
    }  # fmt: skip


@pytest.fixture(scope="module")
def champion(stack, run):
    """The registered champion as MLflow serves it (``mlflow.pyfunc.load_model``), and its version."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    version = client.get_model_version_by_alias("text-sentiment", "champion")
    mlflow.set_tracking_uri(stack.tracking_uri)
    try:
        return mlflow.pyfunc.load_model("models:/text-sentiment@champion"), version, client
    finally:
        mlflow.set_tracking_uri("")


def test_text_dag_succeeds(run):
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


def test_the_generation_has_train_test_and_the_vocabulary_of_the_train_split(staged):
    manifest, tables = staged
    rows = {name: out["rows"] for name, out in manifest["outputs"].items()}
    assert manifest["rows_in"] == ROWS + len(TRICKY)
    assert rows["train"] + rows["test"] == ROWS + len(TRICKY) and 0.15 < rows["test"] / ROWS < 0.25
    vocab = tables["vocab"]
    assert rows["vocab"] == vocab.num_rows and 1000 < vocab.num_rows <= 8000
    assert sorted(vocab.column("id").to_pylist()) == list(range(2, vocab.num_rows + 2))
    assert min(vocab.column("count").to_pylist()) >= 2  # min_count
    assert {"not_good", "not_bad", "good", "bad"} <= set(vocab.column("token").to_pylist())
    assert set(tables["test"].column_names) >= {"doc_id", "text", "label", "tokens"}  # the raw text is kept


def test_spark_and_the_serving_tokeniser_give_the_same_ids_for_every_review(staged):
    _, tables = staged
    vocab = dict(
        zip(
            tables["vocab"].column("token").to_pylist(), tables["vocab"].column("id").to_pylist(), strict=True
        )
    )
    checked = 0
    for name in ("train", "test"):
        table = tables[name]
        for doc_id, raw, ids in zip(
            *(table.column(c).to_pylist() for c in ("doc_id", "text", "tokens")), strict=True
        ):
            assert ids == token_ids(raw, vocab), (doc_id, raw)
            checked += 1
    assert checked == ROWS + len(TRICKY)


def test_the_champion_beats_the_majority_class_and_reads_negation(staged, champion):
    model, version, client = champion
    test = staged[1]["test"].to_pandas()
    test = test[~test.doc_id.str.startswith("tricky-")]
    majority = max(test.label.mean(), 1 - test.label.mean())
    accuracy = client.get_run(version.run_id).data.metrics["test_accuracy"]
    assert accuracy >= majority + 0.15, f"test accuracy {accuracy:.3f}, majority class {majority:.3f}"
    right = model.predict(test[["text"]])["label"].to_numpy() == test.label.to_numpy()
    negated = (test.negated == 1).to_numpy()
    # a bag of unigrams reads "not good" as good: it scores below 0.5 on these (tests/unit/test_text_data.py)
    assert right[negated].mean() >= 0.75, f"accuracy on negated reviews {right[negated].mean():.3f}"
    assert version.tags["partition"] == GOOD


def test_the_logged_model_takes_raw_strings(champion):
    import pandas as pd
    from mlflow.types import DataType

    model, _, _ = champion
    predicted = model.predict(
        pd.DataFrame({"text": ["not good at all", "really great", "I did not hate it."]})
    )
    assert predicted["label"].tolist() == [0, 1, 1]
    (column,) = model.metadata.get_input_schema().inputs
    assert (column.name, column.type) == ("text", DataType.string)
