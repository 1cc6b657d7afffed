"""MLflowRegisterOperator's parts that need no MLflow: arguments, outlets, version tags, XCom, asset event.

The registration itself runs against real MLflow stores in ``tests/integration/test_mlflow_register.py``.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import Asset

from emr_ray.exceptions import MLflowRegistryError
from emr_ray.operators.mlflow import MLflowRegisterOperator, mlflow_model_asset
from emr_ray.promotion import Decision


def _context(map_index: int = -1, ds: str | None = "2026-11-02") -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="retrain", run_id="manual__1", task_id="register", map_index=map_index)
    return {"ti": ti, "ds": ds, "outlet_events": defaultdict(SimpleNamespace)}


def test_bad_arguments_fail_early() -> None:
    with pytest.raises(ValueError, match="use 'max' or 'min'"):
        MLflowRegisterOperator(task_id="t", model_name="m", run_id="r", direction="up")
    with pytest.raises(ValueError, match="must be >= 0"):
        MLflowRegisterOperator(task_id="t", model_name="m", run_id="r", min_improvement=-1)
    with pytest.raises(ValueError, match="give them different names"):
        MLflowRegisterOperator(task_id="t", model_name="m", run_id="r", challenger_alias="champion")


@pytest.mark.parametrize(
    ("model_name", "run_id", "match"),
    [
        (" ", "abc", "model_name rendered empty"),
        ("m", "None", r"run_id rendered 'None'; pass the MLflow run id the training task returned"),
        ("m", "", "run_id rendered ''"),
    ],
)
def test_empty_rendered_arguments_are_refused_before_mlflow_is_called(
    model_name: str, run_id: str, match: str
) -> None:
    op = MLflowRegisterOperator(task_id="t", model_name=model_name, run_id=run_id, emit_asset=False)
    with pytest.raises(MLflowRegistryError, match=match):
        op.execute(context=_context())  # type: ignore[arg-type]


def test_the_model_asset_is_named_after_the_registered_model() -> None:
    asset = mlflow_model_asset("tabular-mlp")
    assert asset.uri == asset.name == "x-mlflow://models/tabular-mlp"
    assert asset.group == "model"


def test_a_static_model_name_makes_the_model_an_outlet() -> None:
    other = Asset("s3://bucket/other")
    op = MLflowRegisterOperator(task_id="x", model_name="asset model", run_id="r", outlets=[other])
    assert op.outlets == [other, mlflow_model_asset("asset model")]
    again = MLflowRegisterOperator(task_id="y", model_name="m", run_id="r", outlets=[mlflow_model_asset("m")])
    assert again.outlets == [mlflow_model_asset("m")]


def test_a_templated_model_name_or_emit_asset_false_adds_no_outlet() -> None:
    assert MLflowRegisterOperator(task_id="y", model_name="{{ params.m }}", run_id="r").outlets == []
    assert MLflowRegisterOperator(task_id="z", model_name="m", run_id="r", emit_asset=False).outlets == []


def test_version_tags_name_the_task_instance_and_the_partition() -> None:
    op = MLflowRegisterOperator(task_id="register", model_name="m", run_id="r")
    assert op._version_tags(_context(), "model") == {
        "airflow.dag_id": "retrain",
        "airflow.run_id": "manual__1",
        "airflow.task_id": "register",
        "artifact_path": "model",
        "partition": "2026-11-02",
    }
    assert op._version_tags(_context(map_index=3, ds=None), "model")["airflow.map_index"] == "3"
    assert "partition" not in op._version_tags(_context(ds=None), "model")


def test_callers_version_tags_win_over_the_defaults() -> None:
    op = MLflowRegisterOperator(
        task_id="register", model_name="m", run_id="r", version_tags={"partition": "2026-01-01", "rows": 5}
    )
    tags = op._version_tags(_context(), "model")
    assert tags["partition"] == "2026-01-01" and tags["rows"] == "5"


def test_the_xcom_result_has_the_documented_keys() -> None:
    op = MLflowRegisterOperator(task_id="register", model_name="m", run_id="r", metric="auc")
    before = {"champion_value_before": 0.8, "champion_version_before": "1"}
    result = op._result("m", "2", "r", 0.9, before, Decision(True, "why"), ["champion"], reused=False)
    assert result == {
        "model_name": "m",
        "version": "2",
        "model_uri": "models:/m/2",
        "run_id": "r",
        "metric": "auc",
        "value": 0.9,
        "champion_value_before": 0.8,
        "champion_version_before": "1",
        "promoted": True,
        "aliases": ["champion"],
        "reused": False,
        "reason": "why",
    }
    skipped = op._result("m", None, "r", 0.5, before, Decision(False, "worse"), [], reused=False)
    assert skipped["model_uri"] is None and skipped["version"] is None


def test_the_asset_event_carries_the_version_and_the_decision() -> None:
    op = MLflowRegisterOperator(task_id="register", model_name="m", run_id="r")
    context = _context()
    before = {"champion_value_before": None, "champion_version_before": None}
    result = op._result(
        "m", "1", "r", 0.7, before, Decision(True, "no champion yet"), ["champion"], reused=False
    )
    op._emit_asset_event(context, "m", result)  # type: ignore[arg-type]
    assert context["outlet_events"][mlflow_model_asset("m")].extra == {
        "model_name": "m",
        "version": "1",
        "model_uri": "models:/m/1",
        "run_id": "r",
        "metric": "test_accuracy",
        "value": 0.7,
        "champion_value_before": None,
        "promoted": True,
        "aliases": ["champion"],
    }

    context = _context()
    nothing = op._result("m", None, "r", 0.7, before, Decision(False, "worse"), [], reused=False)
    op._emit_asset_event(context, "m", nothing)  # type: ignore[arg-type]
    assert context["outlet_events"] == {}
