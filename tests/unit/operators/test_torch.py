"""TorchTrainOperator's parts that need no cluster: the spec's ``compare`` part from ``compare_with_model``.

Training on the real Ray cluster is in ``tests/integration/test_train_resume.py`` and, with a
comparison, ``tests/integration/test_promotion_safety.py``.
"""

from __future__ import annotations

import pytest

from emr_ray.cluster.spec import CompareSection
from emr_ray.exceptions import RayJobInputError
from emr_ray.operators.torch import TorchTrainOperator


def make(**kwargs) -> TorchTrainOperator:
    return TorchTrainOperator(
        task_id="train",
        train_loop="include.models.tabular:train_loop",
        datasets={"train": "file:///s/dt=2026-11-02/train"},
        storage_path="file:///ck",
        **kwargs,
    )


def test_compare_with_model_is_templated_and_fills_the_compare_part() -> None:
    assert "compare_with_model" in TorchTrainOperator.template_fields
    assert make(compare_with_model=" tabular-mlp ")._compare_section() == CompareSection("tabular-mlp")
    assert make(compare_with_model="m", compare_alias="prod")._compare_section() == CompareSection(
        "m", "prod"
    )


@pytest.mark.parametrize("rendered", [None, "", "  ", "None"])
def test_no_model_to_compare_with_compares_nothing(rendered) -> None:
    assert make(compare_with_model=rendered)._compare_section() is None


def test_a_partition_that_is_not_a_date_fails_the_task_without_retries(monkeypatch, tmp_path):
    """Rendered arguments that can never run fail before any cluster work, as AirflowFailException."""
    from airflow.sdk.exceptions import AirflowFailException

    from emr_ray.operators.torch import TorchTrainOperator

    class TaskInstance:
        """Stands in for the Airflow task instance (the unit layer has no metadata database)."""

        dag_id, run_id, task_id, map_index, try_number = "d", "manual__1", "train", -1, 1

    import json

    conn = {"conn_type": "mlflow", "host": f"sqlite:///{tmp_path}/mlflow.db"}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(conn))
    op = TorchTrainOperator(
        task_id="train",
        train_loop="include.models.tabular:train_loop",
        datasets={"train": "file:///s/dt=2026-11-02\n/_generations/g1/train"},
        storage_path="file:///ck",
    )
    with pytest.raises(AirflowFailException, match="is not a date like 2026-11-28"):
        op.execute({"ti": TaskInstance(), "ds": "2026-11-02"})


def test_the_mlflow_login_goes_to_the_job_secrets_and_never_into_the_spec(monkeypatch, tmp_path):
    """``job_secrets`` adds MLflow's variables to the base class's (COS keys only when the spec uses
    COS); the spec, which becomes the job's entrypoint, holds the tracking URI and no secret."""
    import json

    from emr_ray.identity import TaskIdentity

    conn = {"conn_type": "mlflow", "host": f"sqlite:///{tmp_path}/mlflow.db", "login": "alice",
            "password": "pw-unit-torch-4"}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(conn))
    op = make()
    identity = TaskIdentity("d", "manual__1", "train", -1, 1)
    spec = op.build_spec({"ds": "2026-11-02"}, identity).to_dict()
    assert op.job_secrets({}, spec) == {
        "MLFLOW_TRACKING_USERNAME": "alice",
        "MLFLOW_TRACKING_PASSWORD": "pw-unit-torch-4",
    }
    assert "pw-unit-torch-4" not in json.dumps(spec)
    assert spec["mlflow"]["tracking_uri"] == conn["host"]


def test_the_run_is_tagged_with_the_runs_partition_and_the_lineage_tags_the_dag_passes(monkeypatch, tmp_path):
    """``run_tags`` are the DAG's lineage tags, the ones its register task gives the model version."""
    import json

    from emr_ray.identity import TaskIdentity

    conn = {"conn_type": "mlflow", "host": f"sqlite:///{tmp_path}/mlflow.db"}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(conn))
    identity = TaskIdentity("d", "manual__1", "train", -1, 1)
    context = {"params": {"partition": "2026-12-01"}, "ds": "2026-11-02"}
    assert make().build_spec(context, identity).mlflow.tags["partition"] == "2026-12-01"
    tagged = make(run_tags={"generation": "g1"}, experiment_name="tabular").build_spec(context, identity)
    assert tagged.mlflow.tags["generation"] == "g1" and tagged.mlflow.experiment_name == "tabular"


def test_a_finished_job_logs_its_final_metrics_run_and_comparison(capsys) -> None:
    """Both wait paths (polling, and the resumed deferral) end in ``_finish``: the outcome is logged there."""
    result = {
        "final_metrics": {"test_accuracy": 0.91234, "test_loss": 0.25},
        "mlflow_run_id": "r1",
        "tracking_uri": "http://127.0.0.1:5000",
        "run_name": "tabular",
        "checkpoint_uri": "file:///ck/run/checkpoint_000004",
        "comparison": {"model_name": "tabular-mlp", "alias": "champion", "champion_version": "3",
                       "rows": 40, "champion": {"accuracy": 0.8}, "challenger": {"accuracy": 0.9}},
    }  # fmt: skip
    # the XCom keeps the job's JSON: typed on the way, the same keys out (defaults added, none lost)
    assert (
        make()._finish({"submission_id": "s1", "status": "success", "result": result}).items()
        >= result.items()
    )
    logged = capsys.readouterr().out  # the task logger writes to stdout
    assert "Final test_accuracy: 0.9123" in logged
    assert "MLflow run r1, best checkpoint file:///ck/run/checkpoint_000004" in logged
    assert "On the same 40 test rows: champion v3" in logged
    older = {k: v for k, v in result.items() if k != "run_name"}  # a job of other code than this side's
    with pytest.raises(RayJobInputError, match=r"lacks field\(s\) \['run_name'\].*align them"):
        make()._finish({"submission_id": "s1", "status": "success", "result": older})
