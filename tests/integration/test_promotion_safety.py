"""Safe promotion on the real stack: a real ``mlflow server`` and SQLite store, real Ray and Ray Train.

- Two promotions of one model at once (two threads against an ``mlflow server``): the better ends
  champion. And the interleaving the compare-and-set exists for, made certain: a rival's promotion
  lands between this task's decision and its alias write.
- A backfill registers a challenger and leaves the champion where it was, unless asked.
- A decision names both models' scores on the same rows: the training job, run on the Ray cluster
  with ``compare_with_model``, scores the registered champion on its own test split; the register
  task decides on those two figures. When the champion moves after that, the clear of the train
  task that the register task advises scores the new champion, without training again.

The task context is the small stand-in of ``test_ray_jobs`` (these tests call ``execute()``
directly, to run two at once or to run one against a DAG run type ``dag.test()`` cannot make); the
NaN refusal and historical partitions run in real DAG runs in ``test_mlflow_register.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.api.datamodels._generated import DagRunType

from emr_ray.cluster import partitions
from emr_ray.hooks.mlflow import MLflowHook
from emr_ray.operators.mlflow import MLflowRegisterOperator
from emr_ray.operators.torch import TorchTrainOperator
from tests.fixtures.mlflow import MLflowStore, log_torch_run
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration


class DagRunFields:
    """The one DAG run field the register operator reads: how the run was made, as the task SDK's
    enum (a plain ``"backfill"`` here hid that the operator compared the enum's text)."""

    def __init__(self, run_type: str) -> None:
        self.run_type = DagRunType(run_type)


def register(
    run_id: str, name: str, *, run_type: str = "manual", ds: str = "2026-11-05", **kwargs: Any
) -> dict:
    """One ``MLflowRegisterOperator.execute()``, as the task of a DAG run of ``run_type`` for ``ds``."""
    op = MLflowRegisterOperator(
        task_id="register", model_name=name, run_id=run_id, emit_asset=False, **kwargs
    )
    return op.execute({"ti": FakeTaskInstance("register"), "ds": ds, "dag_run": DagRunFields(run_type)})  # type: ignore[arg-type]


def champion_of(store: MLflowStore, name: str) -> str:
    import mlflow

    return str(mlflow.MlflowClient(store.tracking_uri).get_model_version_by_alias(name, "champion").version)


@pytest.fixture
def server(mlflow_server: MLflowStore, monkeypatch: pytest.MonkeyPatch) -> MLflowStore:
    """``mlflow_default`` pointing at the session's ``mlflow server`` (HTTP, proxied artifacts)."""
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", mlflow_server.connection())
    return mlflow_server


# ---------------------------------------------------------------------- two promotions at once
@pytest.mark.parametrize("first", ["better", "worse"])
def test_two_promotions_at_once_the_better_ends_champion(server: MLflowStore, first: str) -> None:
    name = f"race_model_{first}_first"
    register(log_torch_run(server, experiment="race", test_accuracy=0.80, seed=1), name)
    runs = {
        "better": log_torch_run(server, experiment="race", test_accuracy=0.95, seed=2),
        "worse": log_torch_run(server, experiment="race", test_accuracy=0.85, seed=3),
    }
    start = threading.Barrier(2)
    results: dict[str, dict] = {}
    errors: list[BaseException] = []

    def promote(label: str) -> None:
        start.wait()
        try:
            results[label] = register(runs[label], name)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    order = ["better", "worse"] if first == "better" else ["worse", "better"]
    threads = [threading.Thread(target=promote, args=(label,)) for label in order]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert champion_of(server, name) == results["better"]["version"]
    assert results["better"]["promoted"]
    # (the worse one's XCom may say promoted: it can hold the alias for the second until the better
    # one reads it back and takes it again, which is what its ``decisions`` then counts)


class RivalPromotesFirst(MLflowHook):
    """The real hook, plus a fault: right after this task moves its challenger alias (its decision is
    made, the champion alias not yet written), a rival promotion of the same model runs to its end."""

    def __init__(self, rival: Callable[[], dict]) -> None:
        super().__init__()
        self.rival = rival
        self.rival_result: dict | None = None

    def set_alias(self, name: str, alias: str, version: str | int) -> None:
        super().set_alias(name, alias, version)
        if alias == "challenger" and self.rival_result is None:
            self.rival_result = self.rival()


@pytest.mark.parametrize(("mine", "rivals", "i_win"), [(0.90, 0.95, False), (0.95, 0.90, True)])
def test_a_champion_that_moves_before_the_alias_write_is_decided_against_again(
    server: MLflowStore, mine: float, rivals: float, i_win: bool
) -> None:
    name = f"moved_model_{int(mine * 100)}"
    register(log_torch_run(server, experiment="moved", test_accuracy=0.80), name)  # v1
    rival_run = log_torch_run(server, experiment="moved", test_accuracy=rivals)
    my_run = log_torch_run(server, experiment="moved", test_accuracy=mine)
    hook = RivalPromotesFirst(lambda: register(rival_run, name))
    op = MLflowRegisterOperator(task_id="register", model_name=name, run_id=my_run, emit_asset=False)
    op.hook = hook  # the cached hook, with the rival's timing
    result = op.execute({"ti": FakeTaskInstance("register"), "ds": "2026-11-05"})  # type: ignore[arg-type]

    rival = hook.rival_result
    assert rival is not None and rival["promoted"] and rival["champion_version_before"] == "1"
    # decided against v1 first, then against the rival's version, which took the alias in between
    assert result["decisions"] == 2 and result["champion_version_before"] == rival["version"]
    assert result["promoted"] is i_win
    assert f"test_accuracy {mine} vs champion {rivals}" in result["reason"]
    assert champion_of(server, name) == (result["version"] if i_win else rival["version"])


# ---------------------------------------------------------------------- history
def test_a_backfill_registers_a_challenger_and_leaves_the_champion_unless_asked(
    mlflow_conn: MLflowStore,
) -> None:
    name = "backfill_model"
    register(log_torch_run(mlflow_conn, experiment="backfill", test_accuracy=0.80), name, ds="2026-11-01")
    better = log_torch_run(mlflow_conn, experiment="backfill", test_accuracy=0.95)

    kept = register(better, name, run_type="backfill", ds="2026-11-25")  # newer data, but a backfill
    assert (kept["version"], kept["promoted"], kept["historical"], kept["aliases"]) == (
        "2", False, True, ["challenger"],
    )  # fmt: skip
    assert kept["reason"].startswith(
        "historical run (a backfill run): registered as challenger only, champion v1"
    )
    assert champion_of(mlflow_conn, name) == "1"

    asked = register(better, name, run_type="backfill", ds="2026-11-25", promote_historical="True")
    assert (asked["version"], asked["reused"], asked["promoted"]) == ("2", True, True)
    assert champion_of(mlflow_conn, name) == "2"


# ---------------------------------------------------------------------- the same rows
FEATURES = [f"f{i:02d}" for i in range(16)]
TEST_ROWS = 400


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> partitions.Committed:
    """A small committed, standardized partition: 1,600 training and 400 test rows."""
    import pyarrow as pa

    from include.data.synthetic import make_partition

    root = tmp_path_factory.mktemp("staged")
    table = make_partition("2026-11-06", 1600 + TEST_ROWS)
    for c in FEATURES:
        values = table[c].to_numpy()
        scaled = pa.array(((values - values.mean()) / values.std()).astype("float32"))
        table = table.set_column(table.schema.get_field_index(c), c, scaled)
    rows = {"train": table.slice(0, 1600), "test": table.slice(1600)}
    return partitions.write_tables(f"file://{root}/tabular/dt=2026-11-06", rows, {"partition": "2026-11-06"})


def test_the_decision_names_both_models_scores_on_the_same_rows(
    ray_conn: str, mlflow_conn: MLflowStore, staged: partitions.Committed, tmp_path: Path
) -> None:
    """The champion once scored 0.99 on another day's rows; it is a random linear model. Judged by that
    old figure, the new model would stay challenger; scored on the same rows, it wins, and the reason
    says by how much."""
    import mlflow

    name = "same_rows_model"
    champion_run = log_torch_run(
        mlflow_conn, experiment="same-rows", test_accuracy=0.99, inputs=len(FEATURES)
    )
    register(champion_run, name, ds="2026-11-01")
    train = TorchTrainOperator(
        task_id="train",
        train_loop="include.models.tabular:train_loop",
        datasets={n: staged.output_uri(n) for n in ("train", "test")},
        storage_path=f"file://{tmp_path}",
        config={"feature_columns": FEATURES, "label_column": "label", "epochs": 2, "batch_size": 64},
        num_workers=1,
        experiment_name="same-rows",
        compare_with_model=name,
        poll_interval=0.5,
    )
    train_ti = FakeTaskInstance("train")
    trained = train.execute({"ti": train_ti, "ds": "2026-11-06"})

    comparison = trained["comparison"]
    assert (comparison["champion_version"], comparison["rows"]) == ("1", TEST_ROWS)
    run = mlflow.MlflowClient(mlflow_conn.tracking_uri).get_run(trained["mlflow_run_id"])
    data, inputs = run.data, {item.dataset.name: item.dataset for item in run.inputs.dataset_inputs}
    # MLflow's own view of the rows both were scored on: the test dataset's digest, named for v1
    assert inputs[f"test scored with {name} v1"].digest == inputs["test"].digest
    champion_figure = data.metrics["compare.champion.test_accuracy"]
    challenger_figure = data.metrics["compare.challenger.test_accuracy"]
    assert data.tags["compare.rows"] == str(TEST_ROWS) and data.tags["compare.champion_version"] == "1"
    assert comparison["champion"]["test_accuracy"] == pytest.approx(champion_figure)
    # the same rows and the same evaluation as the loop's own last test figures
    assert challenger_figure == pytest.approx(trained["best_metrics"]["test_accuracy"], abs=1e-6)

    decision = register(trained["mlflow_run_id"], name, ds="2026-11-06")
    assert decision["same_rows"] and decision["comparison"]["rows"] == TEST_ROWS
    assert (
        f"on the same {TEST_ROWS} test rows: test_accuracy challenger {challenger_figure} vs champion v1 "
        in (decision["reason"])
    )
    assert str(champion_figure) in decision["reason"]
    assert decision["promoted"] is (challenger_figure > champion_figure)
    assert challenger_figure > champion_figure, "2 epochs of the MLP lost to a random linear model"
    assert decision["value"] < decision["champion_value_before"] == pytest.approx(0.99)

    # Issue 31, item 5: the champion moves (a person sets it to another model) after this run's
    # training compared with v1. The register task refuses to promote on that comparison and says to
    # clear the train task; doing so must run a new job that scores the new champion on the same rows
    # (before, the cleared try reattached to its finished job and handed back the v1 comparison).
    rival = register(log_torch_run(mlflow_conn, experiment="same-rows", test_accuracy=0.5, inputs=len(FEATURES),
                                   seed=3), name, ds="2026-11-01")["version"]  # fmt: skip
    mlflow.MlflowClient(mlflow_conn.tracking_uri).set_registered_model_alias(name, "champion", rival)
    refused = register(trained["mlflow_run_id"], name, ds="2026-11-06")
    assert (
        not refused["promoted"]
        and "clear this run's train task with its downstream tasks" in refused["reason"]
    )
    cleared = FakeTaskInstance("train", try_number=2, run_id=train_ti.run_id)
    again = train.execute({"ti": cleared, "ds": "2026-11-06"})
    assert again["reused"] and again["mlflow_run_id"] == trained["mlflow_run_id"]  # not trained again
    assert (again["comparison"]["champion_version"], again["comparison"]["rows"]) == (rival, TEST_ROWS)
    decided = register(again["mlflow_run_id"], name, ds="2026-11-06")
    assert decided["same_rows"] and f"vs champion v{rival} " in decided["reason"]
    assert decided["promoted"] and champion_of(mlflow_conn, name) == decision["version"]
