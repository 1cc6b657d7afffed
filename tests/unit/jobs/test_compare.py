"""The training job's comparison step (``emr_ray.cluster.jobs.compare``) without a cluster: a real MLflow
SQLite store in a temporary folder, real Parquet test rows, the project's own ``evaluate``.

The step on the real Ray cluster, after a real fit, is in ``tests/integration/test_promotion_safety.py``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from emr_ray.cluster import train as emr_train
from emr_ray.cluster.jobs import compare, shards
from emr_ray.cluster.promotion import comparison_from_run
from emr_ray.cluster.results import ChampionScores, TrainResult
from emr_ray.cluster.spec import CompareSection, MLflowSection, StorageSection, TrainJobSpec
from include.models.tabular import build_model, evaluate

FEATURES = ["f0", "f1", "f2", "f3"]
CONFIG = {"feature_columns": FEATURES, "label_column": "label", "hidden": 8, "batch_size": 16}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, new_sqlite_store) -> str:
    root = tmp_path_factory.mktemp("mlflow")
    uri = new_sqlite_store(root)
    import mlflow

    mlflow.MlflowClient(uri).create_experiment("compare", artifact_location=(root / "artifacts").as_uri())
    return uri


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Test rows in two Parquet files (30 + 20 rows), as the training job's plan lists them."""
    root = tmp_path_factory.mktemp("staged") / "dt=2026-11-05" / "test"
    os.makedirs(root)
    rng = np.random.default_rng(0)
    files = []
    for i, rows in enumerate((30, 20)):
        x = rng.normal(size=(rows, len(FEATURES))).astype("float32")
        table = pa.table(
            {**{c: x[:, j] for j, c in enumerate(FEATURES)}, "label": (x[:, 0] > 0).astype("int64")}
        )
        pq.write_table(table, root / f"part-{i}.parquet", row_group_size=7)
        files.append((str(root / f"part-{i}.parquet"), rows))
    return {"datasets": {"test": shards.describe(root.as_uri(), files, equal=False)}, "storage": {}}


def spec_for(
    store: str, model_name: str, train_loop: str = "include.models.tabular:train_loop"
) -> TrainJobSpec:
    return TrainJobSpec(
        train_loop=train_loop,
        datasets={"train": "file:///d/dt=2026-11-05/train", "test": "file:///d/dt=2026-11-05/test"},
        run_name="r",
        storage_path="file:///unused",
        mlflow=MLflowSection(tracking_uri=store, experiment_name="compare"),
        config=CONFIG,
        compare=CompareSection(model_name=model_name),
    )


def log(store: str, model, inputs: int = len(FEATURES)) -> str:
    """Log ``model`` (pickled: exporting a graph, as the training job does, costs seconds; the
    integration test loads such a graph); its model URI."""
    import mlflow
    import mlflow.pytorch

    client = mlflow.MlflowClient(store)
    run = client.create_run(client.get_experiment_by_name("compare").experiment_id)
    mlflow.set_tracking_uri(store)
    try:
        with mlflow.start_run(run_id=run.info.run_id):
            return mlflow.pytorch.log_model(
                model.eval(),
                name="model",
                input_example=np.zeros((3, inputs), dtype=np.float32),
                serialization_format="pickle",
                pip_requirements=["torch"],
            ).model_uri
    finally:
        mlflow.set_tracking_uri("")


def register(store: str, name: str, model_uri: str) -> str:
    """Register ``model_uri`` as a new version of ``name`` and make it the champion; its version."""
    import mlflow

    mlflow.set_tracking_uri(store)
    try:
        version = str(mlflow.register_model(model_uri, name).version)
    finally:
        mlflow.set_tracking_uri("")
    mlflow.MlflowClient(store).set_registered_model_alias(name, "champion", version)
    return version


@pytest.fixture(scope="module")
def champion_model():
    """A tabular MLP as a champion: the model, and its URI once logged."""
    import torch

    torch.manual_seed(1)
    return build_model(CONFIG)


@pytest.fixture(scope="module")
def champion_uri(store: str, champion_model) -> str:
    return log(store, champion_model)


def new_run(store: str) -> str:
    import mlflow

    client = mlflow.MlflowClient(store)
    return client.create_run(client.get_experiment_by_name("compare").experiment_id).info.run_id


def run_data(store: str, run_id: str):
    import mlflow

    return mlflow.MlflowClient(store).get_run(run_id).data


def test_both_models_are_scored_on_every_test_row_and_logged(
    store: str, plan: dict, champion_model, champion_uri: str, caplog
) -> None:
    """Scored as a warm group's rank 0 scores: the champion in a process of its own, which has ended
    when the call returns (nothing unpickled from the registry stays in the process that serves the
    next jobs), with the same figures as the model it was logged from."""
    import torch

    spec = spec_for(store, "champ")
    version = register(store, "champ", champion_uri)
    torch.manual_seed(2)
    challenger = build_model(spec.config)
    run_id = new_run(store)

    with caplog.at_level("INFO", logger="emr_ray.cluster.jobs.clean_process"):
        result = compare.with_champion(spec, plan, spec.storage.options(), run_id, challenger, isolated=True)

    [ran] = [r.getMessage() for r in caplog.records if "which has ended" in r.getMessage()]
    pid = int(ran.split(" in process ")[1].split(",")[0])
    assert pid != os.getpid() and not os.path.exists(f"/proc/{pid}")

    table = compare.read_test_rows(plan, spec.storage.options())
    assert table.num_rows == 50
    assert result is not None
    assert (result.model_name, result.alias, result.champion_version, result.rows) == (
        "champ", "champion", version, 50,
    )  # fmt: skip
    # the champion as MLflow loads it from the registry scores what the model it was logged from scores
    assert result.champion == pytest.approx(evaluate(champion_model, spec.config, table))
    assert result.challenger == pytest.approx(evaluate(challenger, spec.config, table))
    assert set(result.champion) == {"test_loss", "test_accuracy"}
    data = run_data(store, run_id)
    assert data.tags["compare.champion_version"] == version and data.tags["compare.rows"] == "50"
    assert data.metrics["compare.champion.test_accuracy"] == pytest.approx(result.champion["test_accuracy"])
    assert data.metrics["compare.challenger.test_loss"] == pytest.approx(result.challenger["test_loss"])
    read_back = comparison_from_run(data.tags, data.metrics, model_name="champ", metric="test_accuracy")
    assert read_back is not None and read_back.rows == 50 and read_back.champion_version == version


def test_without_a_champion_nothing_is_scored_and_the_run_says_so(store: str, plan: dict) -> None:
    spec = spec_for(store, "never-registered")
    run_id = new_run(store)
    result = compare.with_champion(spec, plan, spec.storage.options(), run_id, build_model(spec.config))
    assert result is not None and result.champion_version is None and result.champion == {}
    assert run_data(store, run_id).tags["compare.champion_version"] == "none"


def test_no_comparison_asked_is_none(store: str, plan: dict) -> None:
    spec = dataclasses.replace(spec_for(store, "x"), compare=None)
    assert compare.with_champion(spec, plan, spec.storage.options(), "unused", None) is None


def test_a_module_without_evaluate_skips_and_says_what_to_add(store: str, plan: dict) -> None:
    spec = spec_for(
        store, "champ", train_loop="emr_ray.cluster.jobs.shards:plan"
    )  # a module without evaluate
    run_id = new_run(store)
    result = compare.with_champion(spec, plan, spec.storage.options(), run_id, None)
    assert result is not None and "has no evaluate(model, config, table)" in result.skipped
    assert "EvaluatingModule" in run_data(store, run_id).tags["compare.skipped"]


def test_a_champion_trained_on_other_columns_is_skipped_not_fatal(store: str, plan: dict) -> None:
    import torch

    register(store, "narrow", log(store, torch.nn.Linear(3, 2), inputs=3))
    spec = spec_for(store, "narrow")
    run_id = new_run(store)
    result = compare.with_champion(spec, plan, spec.storage.options(), run_id, build_model(spec.config))
    assert result is not None and "could not be scored on these rows" in result.skipped
    data = run_data(store, run_id)
    assert (
        "compare.champion_version" not in data.tags and "could not be scored" in data.tags["compare.skipped"]
    )


def stored_result(run_id: str, checkpoint_uri: str, comparison: ChampionScores | None) -> TrainResult:
    """A finished training's stored result, as a rerun with the same inputs reads it back."""
    return TrainResult(mlflow_run_id=run_id, tracking_uri="file:///mlruns", run_name="run",
                       checkpoint_uri=checkpoint_uri, final_metrics={}, comparison=comparison)  # fmt: skip


def test_a_reused_result_is_compared_again_only_when_the_champion_changed(
    store: str, plan: dict, champion_uri: str, tmp_path: Path
) -> None:
    import torch

    spec = spec_for(store, "moving")
    first = register(store, "moving", champion_uri)
    torch.manual_seed(3)
    challenger = build_model(spec.config)
    emr_train.save_state(str(tmp_path), model=challenger, optimizer=None, epoch=0, metrics={})
    run_id = new_run(store)
    comparison = compare.with_champion(spec, plan, spec.storage.options(), run_id, challenger)
    stored = stored_result(run_id, tmp_path.as_uri(), comparison)

    def no_plan() -> dict:
        raise AssertionError("compared again although the champion did not change")

    assert compare.refresh(spec, stored, no_plan, spec.storage.options()) == stored.comparison

    second = register(store, "moving", champion_uri)  # another version (of the same model)
    again = compare.refresh(spec, stored, lambda: plan, spec.storage.options())
    assert again is not None and again.champion_version == second != first
    # the challenger rebuilt from its checkpoint scores what it scored before
    assert again.challenger == pytest.approx(comparison.challenger)
    assert run_data(store, run_id).tags["compare.champion_version"] == second


def test_evaluate_scores_loss_and_accuracy_like_the_training_loop(plan: dict) -> None:
    import torch

    config = {"feature_columns": FEATURES, "label_column": "label", "batch_size": 7}
    table = compare.read_test_rows(plan, StorageSection().options())
    model = torch.nn.Linear(len(FEATURES), 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.0, 0, 0, 0], [1.0, 0, 0, 0]]))
        model.bias.zero_()
    figures = evaluate(model, config, table)
    assert figures["test_accuracy"] == 1.0  # the label is f0 > 0
    x = torch.tensor(np.column_stack([table.column(c).to_numpy() for c in FEATURES]))
    y = torch.tensor(table.column("label").to_numpy())
    expected = torch.nn.functional.cross_entropy(model(x), y).item()
    assert figures["test_loss"] == pytest.approx(expected, rel=1e-5) and math.isfinite(figures["test_loss"])


def test_a_reused_result_whose_checkpoint_is_gone_stands_uncompared(
    store: str, plan: dict, tmp_path: Path
) -> None:
    spec = spec_for(store, "champ")
    run_id = new_run(store)
    stored = stored_result(run_id, (tmp_path / "gone").as_uri(), None)
    result = compare.refresh(spec, stored, lambda: plan, spec.storage.options())
    assert result is not None and result.skipped.startswith(
        "the stored model or its test rows cannot be read"
    )
    assert "cannot be read again" in run_data(store, run_id).tags["compare.skipped"]
