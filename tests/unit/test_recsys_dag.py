"""The recommender DAG is the article's pipeline with the shared operators, and its steps agree with each
other: what Spark writes is what the model reads, and the cluster check asks for what the tasks use."""

from __future__ import annotations

from pathlib import Path

import pytest

from emr_ray.cluster import batches
from include.preprocessing import recsys as preprocessing

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "retrain_recsys.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["retrain_recsys"]


def test_it_is_the_article_pipeline(dag):
    order = ["wait_for_partition", "check_cluster", "preprocess", "train", "register"]
    for upstream, downstream in zip(order, order[1:], strict=False):
        assert dag.get_task(upstream).downstream_task_ids == {downstream}
    assert "raw_interactions" in dag.get_task("wait_for_partition").bucket_key
    register, train = dag.get_task("register"), dag.get_task("train")
    assert (register.metric, register.direction) == ("recall_at_10", "max")
    assert train.compare_with_model == register.model_name == "recsys-two-tower"


def test_the_model_reads_what_the_preprocessing_writes(dag):
    train, preprocess = dag.get_task("train"), dag.get_task("preprocess")
    contract = batches.batch_spec(train.config)
    assert [i.name for i in contract.inputs] == ["user", "item", "history"]
    history = contract.inputs[2]
    assert history.length == preprocess.config["max_history"]  # the exclusions the ranking sees are whole
    assert contract.metric_columns == ("popularity_hit_at_10",)
    assert set(train.datasets) == {"train", "test", "users", "items"}  # the indexes travel with the model
    settings = preprocessing.settings(preprocess.config | {"negatives": dag.params["negatives"]})
    assert settings["negatives"] == 4 and settings["min_interactions"] >= 2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"negatives": 0}, "negatives=0; use an integer >= 1"),
        ({"min_interactions": "one"}, "min_interactions='one'"),
        ({"positive_events": "click"}, "use a non-empty list"),
    ],
)
def test_bad_preprocessing_settings_are_refused_with_the_fix(config, message):
    with pytest.raises(ValueError, match=message):
        preprocessing.settings(config)
