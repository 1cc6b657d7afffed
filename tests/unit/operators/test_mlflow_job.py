"""MLflowJobOperator: the MLflow part of a training job's spec, and that a training's MLflow run and its model
version name the same partition and generation in every kind of DAG run.

Both training operators build on it (``test_torch.py``, ``test_rllib.py``); the tags as written by real
jobs and registrations are in ``tests/integration/test_mlflow_auth.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from emr_ray.identity import TaskIdentity
from emr_ray.operators.mlflow import MLflowRegisterOperator
from emr_ray.operators.mlflow_job import MLflowJobOperator
from emr_ray.operators.rllib import RLlibTrainOperator
from emr_ray.operators.torch import TorchTrainOperator
from tests.unit.run_contexts import GENERATION, KINDS, RunKind

#: the shipped DAGs that train a model and register it
TRAINING_DAGS = ("retrain_tabular", "retrain_digits", "retrain_text", "retrain_recsys", "retrain_rl")
#: the tags that say which data a model came from
LINEAGE = ("partition", "generation", "data_uri")


@pytest.fixture
def mlflow_conn(monkeypatch, tmp_path) -> str:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({"conn_type": "mlflow", "host": uri}))
    return uri


def rendered(task: Any, context: dict[str, Any], field: str) -> Any:
    """A copy of the DAG's ``task`` with ``field`` rendered for ``context``, as a task instance renders it."""
    copy = task.prepare_for_execution()
    setattr(copy, field, task.render_template(getattr(task, field), context))
    return copy


def lineage(tags: dict[str, str]) -> dict[str, str | None]:
    return {key: tags.get(key) for key in LINEAGE}


@pytest.mark.parametrize(
    ("dag_id", "kind"),
    [
        pytest.param(dag_id, kind, id=f"{dag_id}-{kind.name}")
        for dag_id in TRAINING_DAGS
        for kind in KINDS
        if not (dag_id == "retrain_rl" and kind.partition_param)  # it has no partition Param to choose with
    ],
)
def test_the_run_and_its_model_version_name_the_same_partition_and_generation(
    dagbag, mlflow_conn, dag_id: str, kind: RunKind
) -> None:
    dag = dagbag.dags[dag_id]
    has_param = "partition" in dag.params
    train_context = kind.context("train", partition_param=has_param)
    register_context = kind.context("register", partition_param=has_param)
    train = rendered(dag.get_task("train"), train_context, "run_tags")
    register = rendered(dag.get_task("register"), register_context, "version_tags")

    run_tags = train.mlflow_section(train_context, TaskIdentity.from_context(train_context)).tags
    version_tags = register._version_tags(register_context, "model")

    assert lineage(run_tags) == lineage(version_tags)
    assert run_tags["partition"] == kind.partition
    assert run_tags.get("generation") == (GENERATION if "preprocess" in dag.task_ids else None)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_without_lineage_tags_both_default_to_the_runs_partition(mlflow_conn, kind: RunKind) -> None:
    """What an operator of its own gets: the run's partition, not ``ds`` (absent in a manual run without
    a logical date)."""
    context = kind.context()
    train = TorchTrainOperator(task_id="train", train_loop="m:loop", datasets={}, storage_path="file:///ck")
    register = MLflowRegisterOperator(task_id="register", model_name="m", run_id="r")
    run_tags = train.mlflow_section(context, TaskIdentity.from_context(context)).tags
    assert run_tags["partition"] == register._version_tags(context, "model")["partition"] == kind.partition


def test_run_tags_are_templated_and_go_over_the_identity_and_partition(mlflow_conn) -> None:
    for operator in (TorchTrainOperator, RLlibTrainOperator):
        assert {"run_tags", "experiment_name"} <= set(operator.template_fields)
        assert operator.template_fields_renderers["run_tags"] == "json"
    op = MLflowJobOperator(task_id="train", run_tags={"partition": "2026-01-01", "rows": 5})
    context = KINDS[0].context()
    tags = op.mlflow_section(context, TaskIdentity.from_context(context)).tags
    assert tags == {
        "airflow.dag_id": "d",
        "airflow.run_id": "r1",
        "airflow.task_id": "train",
        "airflow.map_index": "-1",
        "partition": "2026-01-01",
        "rows": "5",
    }


def test_the_experiment_is_named_or_else_the_dags(mlflow_conn) -> None:
    context = KINDS[0].context()
    identity = TaskIdentity.from_context(context)
    assert MLflowJobOperator(task_id="t").mlflow_section(context, identity).experiment_name == "d"
    named = MLflowJobOperator(task_id="t", experiment_name="rl").mlflow_section(context, identity)
    assert (named.experiment_name, named.tracking_uri) == ("rl", mlflow_conn)
