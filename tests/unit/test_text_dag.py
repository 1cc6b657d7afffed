"""The text DAG (dags/retrain_text.py) is the article's pipeline with the provider's operators, and its
preprocessing and training agree on what they share (the vocabulary size, the columns)."""

from __future__ import annotations

from pathlib import Path

import pytest

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "retrain_text.py"


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    return bag.dags["retrain_text"]


def test_the_text_dag_is_the_article_pipeline(dag):
    order = ["wait_for_partition", "check_cluster", "preprocess", "train", "register"]
    assert [t.task_id for t in dag.topological_sort()] == order
    kinds = {t.task_id: type(t).__name__ for t in dag.tasks}
    assert kinds == {"wait_for_partition": "COSSensor", "check_cluster": "RayConnectOperator",
                     "preprocess": "RayDPSparkOperator", "train": "TorchTrainOperator",
                     "register": "MLflowRegisterOperator"}  # fmt: skip
    assert "raw_text" in dag.get_task("wait_for_partition").bucket_key


def test_training_reads_the_vocabulary_the_spark_step_builds(dag):
    preprocess, train = dag.get_task("preprocess"), dag.get_task("train")
    assert preprocess.preprocess == "include.preprocessing.text:tokenize"
    assert set(train.datasets) == {"train", "test", "vocab"}
    assert train.config["vocab_size"] == preprocess.config["vocab_size"]
    assert train.config["text_column"] == preprocess.config["text_column"] == "text"
    (tokens,) = train.config["inputs"]
    assert (tokens["column"], tokens["dtype"], tokens["pad"]) == ("tokens", "int64", 0)
    assert train.compare_with_model == dag.get_task("register").model_name == "text-sentiment"
