"""The Retraining view's model (``emr_ray.views.model``): one row per partition-run from what the
operators returned, filters, newest first, paging, and the champion now, on plain records."""

from __future__ import annotations

import dataclasses
import time

import pytest

from devstack.retraining_runs import (
    MODEL,
    preprocess_result,
    register_result,
    run,
    scoring,
    synthetic_runs,
    train_result,
)
from emr_ray.views.model import (
    CHALLENGER,
    NO_DECISION,
    NOT_REGISTERED,
    PROMOTED,
    FilterError,
    Filters,
    build_view,
    partition_row,
    task_kind,
)
from emr_ray.views.records import Registry, RunRecord

PROMOTING = register_result("3", True, 0.93, 0.91, "2")
KEEPING = register_result("4", False, 0.90, 0.93, "3")


def test_a_row_holds_what_each_task_returned():
    row = partition_row(run("2026-11-28", register=PROMOTING))
    assert (row.partition, row.run_type, row.state) == ("2026-11-28", "scheduled", "success")
    assert (row.generation, row.rows_in, row.rows_out) == ("g-2026-11-28-1", 20000, 20000)
    assert (row.model_name, row.version, row.decision) == (MODEL, "3", PROMOTED)
    assert (row.gate.metric, row.gate.challenger, row.gate.champion, row.gate.champion_version) == (
        "test_accuracy", 0.93, 0.91, "2",
    )  # fmt: skip
    assert row.reason == "better than the champion"
    assert row.cpu_by_task == {"preprocess": 40.0, "train": 60.0}
    assert (row.cpu_seconds, row.gpu_seconds) == (100.0, 0.0)
    assert row.task_seconds["train"] == 45.0 and list(row.task_seconds)[0] == "wait_for_partition"
    assert [link.label for link in row.links] == [
        "Ray job (preprocess)", "Ray job (train)", "MLflow Run", "MLflow Model Version",
    ]  # fmt: skip
    assert row.notes == ()


def test_tasks_are_recognised_by_what_they_returned_not_by_their_ids():
    assert task_kind(PROMOTING) == "register"
    assert task_kind(train_result("x")) == "train"
    assert task_kind(preprocess_result("2026-11-28")) == "preprocess"
    # an older or newer provider's result: what the view knows of it reads, the rest is ignored
    assert task_kind(preprocess_result("2026-11-28") | {"from_a_later_version": 1}) == "preprocess"
    dry_run = {
        k: v for k, v in preprocess_result("2026-11-28").items() if k not in ("generation", "output_uri")
    }
    assert task_kind(dry_run) is None  # validate_only committed nothing: not a partition's preprocessing
    assert (
        task_kind({"ray_version": "2.60"}) is None and task_kind("text") is None and task_kind(None) is None
    )


def test_the_gate_shows_both_models_on_the_same_rows_when_the_training_scored_the_champion():
    same = register_result("5", False, 0.95, 0.97, "3") | {
        "same_rows": True,
        "comparison": {
            "champion_version": "3",
            "rows": 4000,
            "challenger_value": 0.90,
            "champion_value": 0.92,
        },
    }
    gate = partition_row(run("2026-11-29", register=same)).gate
    assert (gate.challenger, gate.champion, gate.same_rows) == (0.90, 0.92, True)


@pytest.mark.parametrize(
    ("register", "decision"),
    [(PROMOTING, PROMOTED), (KEEPING, CHALLENGER), (register_result(None, False, 0.8, 0.9, "3"), NOT_REGISTERED),
     (None, NO_DECISION)],
)  # fmt: skip
def test_each_outcome_of_the_registration_is_a_decision(register, decision):
    assert partition_row(run("2026-11-28", register=register)).decision == decision


def test_what_is_missing_is_none_with_a_note_never_an_error():
    failed = run("2026-11-28", state="failed", register=None, train_cpu=None)
    row = partition_row(failed)
    assert (row.version, row.gate.challenger, row.reason) == (None, None, None)
    assert row.cpu_by_task == {"preprocess": 40.0}
    assert row.notes == ("train: no usage recorded", "no registration result")
    bare = partition_row(RunRecord("d", "manual__x", "manual", "queued"))
    assert (bare.partition, bare.cpu_seconds, bare.rows_in, bare.notes) == (None, None, None, ())


def test_the_partition_is_the_preprocessings_else_the_param_else_the_logical_date():
    base = run("2026-11-28", run_type="manual", register=KEEPING)
    assert partition_row(base).partition == "2026-11-28"
    tasks = tuple(t for t in base.tasks if t.task_id != "preprocess")
    param = dataclasses.replace(base, tasks=tasks, conf={"partition": "2026-11-20"})
    assert partition_row(param).partition == "2026-11-20"
    no_date = dataclasses.replace(base, tasks=tasks, logical_date=None)
    assert partition_row(no_date).partition == "2026-11-28"  # run_after (the next day) less one day


def test_run_types_are_named_as_a_user_says_them():
    types = {partition_row(run("2026-11-28", run_type=t)).run_type for t in ("asset_triggered", "backfill")}
    assert types == {"asset", "backfill"}


def test_newest_partition_first_and_paged():
    view = build_view("d", synthetic_runs(30), page=2, page_size=10)
    assert (view.total, view.pages, view.page) == (30, 3, 2)
    assert [row.partition for row in view.rows][:2] == ["2026-01-20", "2026-01-19"]
    assert view.chronological[0].partition == "2026-01-01" and len(view.chronological) == 30
    assert view.task_order == ("wait_for_partition", "check_cluster", "preprocess", "train", "register")


def test_filters_by_date_range_state_and_decision():
    runs = [*synthetic_runs(10), run("2026-01-05", state="failed", register=None, run_id="manual__again")]
    dated = build_view("d", runs, Filters.parse("2026-01-03", "2026-01-05"))
    assert sorted({row.partition for row in dated.rows}) == ["2026-01-03", "2026-01-04", "2026-01-05"]
    assert dated.total == 4
    failed = build_view("d", runs, Filters.parse(states=["failed"]))
    assert [row.run_id for row in failed.rows] == ["manual__again"]
    promoted = build_view("d", runs, Filters.parse(decisions=[PROMOTED]))
    assert promoted.total > 0 and all(row.decision == PROMOTED for row in promoted.rows)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"start": "2026-13-01"}, "from='2026-13-01': give a date as YYYY-MM-DD"),
     ({"decisions": ["won"]}, r"decision \['won'\]: choose from")],
)  # fmt: skip
def test_a_bad_filter_says_what_is_accepted(kwargs, match):
    with pytest.raises(FilterError, match=match):
        Filters.parse(**kwargs)


def test_the_champion_now_comes_from_mlflow_with_the_run_that_promoted_it():
    runs = [run("2026-11-27", register=PROMOTING), run("2026-11-28", register=KEEPING)]
    registry = Registry({MODEL: {"champion": "3", "challenger": "4"}}, {f"{MODEL}/3": "http://mlflow/v3"})
    serving = build_view("d", runs, registry=registry).serving
    assert (serving.version, serving.source, serving.partition, serving.url) == (
        "3",
        "mlflow",
        "2026-11-27",
        "http://mlflow/v3",
    )
    assert serving.promoted_by == runs[0].run_id and serving.reason == "better than the champion"
    assert serving.note is None


def test_a_champion_set_outside_the_runs_is_shown_and_said():
    serving = build_view(
        "d", [run("2026-11-27", register=PROMOTING)], registry=Registry({MODEL: {"champion": "9"}})
    ).serving
    assert (serving.version, serving.promoted_by, serving.note) == (
        "9",
        None,
        "promoted outside this DAG's recorded runs",
    )


def test_with_mlflow_down_the_champion_is_the_last_promotion_the_runs_recorded():
    runs = [run("2026-11-27", register=PROMOTING), run("2026-11-28", register=KEEPING)]
    serving = build_view("d", runs, registry=Registry(error="ConnectionError: refused")).serving
    assert (serving.version, serving.source) == ("3", "runs")
    assert (
        serving.note
        == "MLflow unavailable (ConnectionError: refused): the champion as this DAG's last promotion left it"
    )


def test_a_dag_without_registrations_says_so():
    assert build_view("d", []).serving.note == "no run of this DAG has registered a model yet"


def test_paging_outside_its_limits_is_refused():
    with pytest.raises(FilterError, match="page must be >= 1"):
        build_view("d", [], page=0)


def test_each_row_says_which_aliases_its_version_holds_now():
    runs = [run("2026-11-27", register=PROMOTING), run("2026-11-28", register=KEEPING)]
    registry = Registry({MODEL: {"champion": "3", "challenger": "4"}})
    rows = {row.version: row.aliases for row in build_view("d", runs, registry=registry).rows}
    assert rows == {"3": ("champion",), "4": ("challenger",)}
    down = build_view("d", runs, registry=Registry(error="down")).rows
    assert all(row.aliases == () for row in down)  # unknown, not "none"


def test_each_row_shows_the_batch_scorings_its_version_made_in_any_dag():
    """Issue 55: the scoring runs beside the training that produced the version. A scoring task that
    has not returned a scoring's result (running, failed) names no version and shows nowhere."""
    runs = [run("2026-11-27", register=PROMOTING), run("2026-11-28", register=KEEPING)]
    scorings = [
        scoring("3", "2026-11-27", rows=3948),
        scoring("3", "2026-11-27", rows=3948, dag_id="score_nightly", run_id="scheduled__x"),
        dataclasses.replace(scoring("4", "2026-11-28"), state="running", result=None),
    ]
    rows = {row.version: row for row in build_view("d", runs, scorings=scorings).rows}
    three = rows["3"].scored
    assert [(s.dag_id, s.rows, s.partition, s.generation) for s in three] == [
        ("score_tabular", 3948, "2026-11-27", "g-3"),
        ("score_nightly", 3948, "2026-11-27", "g-3"),
    ]
    assert three[0].link is not None and three[0].link.url.endswith("-score")
    assert rows["4"].scored == ()


def test_a_running_training_shows_its_epoch_and_latest_metrics_as_mlflow_has_them(
    tmp_path, monkeypatch, new_sqlite_store
):
    """A run still training: MLflow's run for the task (found by the name every try gives it) says how
    far it got; the row shows it and the page reloads itself while a run is going."""
    import mlflow

    from emr_ray.identity import TaskIdentity
    from emr_ray.views import page, sources
    from emr_ray.views.mlflow_reads import Reads
    from emr_ray.views.records import TaskRecord

    uri = new_sqlite_store(tmp_path)
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_VIEW", f'{{"conn_type": "mlflow", "host": "{uri}"}}')
    going = run("2026-11-30", state="running")
    going = dataclasses.replace(
        going,
        tasks=(*going.tasks[:3], TaskRecord("train", "running", None, None), TaskRecord("register", None)),
    )
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment(going.dag_id, artifact_location=(tmp_path / "a").as_uri())
    name = TaskIdentity(going.dag_id, going.run_id, "train").run_name
    mlflow_run = client.create_run(experiment, tags={"emr_ray.run_name": name})
    client.log_param(mlflow_run.info.run_id, "epochs", "5")
    for epoch, loss in enumerate([0.5, 0.31236]):
        client.log_metric(mlflow_run.info.run_id, "test_loss", loss, step=epoch)

    patient = time.monotonic() + 60  # a first read of a new store imports and migrates: not the budget's test
    progress = sources.read_progress(going.dag_id, [going], "mlflow_view", patient, Reads())
    assert progress == {going.run_id: "epoch 2 of 5: test_loss 0.3124"}
    view = build_view(going.dag_id, [going], registry=Registry(progress=progress))
    assert view.rows[0].progress == "epoch 2 of 5: test_loss 0.3124"
    html = page.render(view)
    assert "epoch 2 of 5: test_loss 0.3124" in html and page.REFRESH in html
    assert sources.read_progress(going.dag_id, [run("2026-11-29")], "mlflow_view") == {}  # nothing going
