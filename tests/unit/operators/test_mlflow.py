"""MLflowRegisterOperator's parts that need no MLflow: arguments, outlets, version tags, XCom, asset event.

The registration itself runs against real MLflow stores in ``tests/integration/test_mlflow_register.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk import Asset
from airflow.sdk.execution_time.context import OutletEventAccessors

from emr_ray.cluster.promotion import Comparison, Decision
from emr_ray.exceptions import MLflowRegistryError
from emr_ray.operators.mlflow import Candidate, Champion, MLflowRegisterOperator, mlflow_model_asset
from tests.unit.run_contexts import KINDS

KINDS_BY_NAME = {kind.name: kind for kind in KINDS}


class TaskInstanceFields:
    """Stands in for the task instance in a context: the operator reads only its identity fields
    here, and the unit layer has no Airflow database for a real one. Real task instances in real DAG
    runs are in ``tests/integration/test_mlflow_register.py``."""

    def __init__(self, map_index: int) -> None:
        self.dag_id = "retrain"
        self.run_id = "manual__1"
        self.task_id = "register"
        self.map_index = map_index


def _context(map_index: int = -1, ds: str | None = "2026-11-02") -> dict[str, Any]:
    """The context keys the operator reads; ``outlet_events`` is Airflow's own accessor."""
    return {"ti": TaskInstanceFields(map_index), "ds": ds, "outlet_events": OutletEventAccessors()}


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


def test_the_partition_tag_is_the_runs_partition_even_without_a_logical_date() -> None:
    """A manual run without a logical date has no ``ds``: its partition is the chosen one, else the day
    before it ran (what the DAG's tasks processed, and what the training run is tagged with)."""
    op = MLflowRegisterOperator(task_id="register", model_name="m", run_id="r")
    chosen, unchosen = KINDS_BY_NAME["manual, a partition chosen"], KINDS_BY_NAME["manual, no logical date"]
    assert op._version_tags(chosen.context("register"), "model")["partition"] == "2026-12-01"
    assert op._version_tags(unchosen.context("register"), "model")["partition"] == "2026-12-03"


def test_callers_version_tags_win_over_the_defaults() -> None:
    op = MLflowRegisterOperator(
        task_id="register", model_name="m", run_id="r", version_tags={"partition": "2026-01-01", "rows": 5}
    )
    tags = op._version_tags(_context(), "model")
    assert tags["partition"] == "2026-01-01" and tags["rows"] == "5"


def _candidate(value: float, comparison: Comparison | None = None, run_type: str = "manual") -> Candidate:
    return Candidate("r", value, comparison, partition="2026-11-02", run_type=run_type)


def test_the_xcom_result_has_the_documented_keys() -> None:
    op = MLflowRegisterOperator(task_id="register", model_name="m", run_id="r", metric="auc")
    champion = Champion("1", 0.8, "2026-11-01")
    comparison = Comparison("1", 800, 0.91, 0.88)
    decision = Decision(True, "why", same_rows=True)
    result = op._result(
        "m", "2", _candidate(0.9, comparison), champion, decision, ["champion"], reused=False, decisions=2
    )
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
        "comparison": {
            "champion_version": "1",
            "rows": 800,
            "challenger_value": 0.91,
            "champion_value": 0.88,
        },
        "same_rows": True,
        "historical": False,
        "decisions": 2,
    }
    skipped = op._result("m", None, _candidate(0.5), champion, Decision(False, "worse"), [], reused=False)
    assert skipped["model_uri"] is None and skipped["version"] is None
    assert skipped["comparison"] is None and skipped["decisions"] == 1
    backfill = op._result("m", "3", _candidate(0.5, run_type="backfill"), champion, Decision(False, "x"), [],
                          reused=False)  # fmt: skip
    assert backfill["historical"] is True


def test_the_asset_event_carries_the_version_and_the_decision() -> None:
    op = MLflowRegisterOperator(task_id="register", model_name="m", run_id="r")
    context = _context()
    result = op._result(
        "m", "1", _candidate(0.7), Champion(), Decision(True, "no champion yet"), ["champion"], reused=False
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
    nothing = op._result("m", None, _candidate(0.7), Champion(), Decision(False, "worse"), [], reused=False)
    op._emit_asset_event(context, "m", nothing)  # type: ignore[arg-type]
    assert list(context["outlet_events"]) == []


def test_a_promotion_waits_for_concurrent_writers_only_outside_the_one_slot_promotion_pool() -> None:
    from emr_ray.operators.mlflow import ALIAS_SETTLE_SECONDS
    from emr_ray.params import PROMOTION_POOL

    alone = MLflowRegisterOperator(task_id="r1", model_name="m", run_id="x", pool=PROMOTION_POOL)
    shared = MLflowRegisterOperator(task_id="r2", model_name="m", run_id="x")
    assert alone.alias_settle_seconds == 0.0
    assert shared.alias_settle_seconds == ALIAS_SETTLE_SECONDS > 0
