"""The retraining DAG end to end, through ``airflow dags test`` (the CLI), on the real local stack:
Airflow, a Ray head reached over the Jobs API, Spark on Ray (RayDP), Ray Train, MLflow (SQLite) and
the COS stand-in. The first model registered becomes champion; that a weaker one is not promoted is
shown on the running Airflow (``tests/system/test_airflow_live.py``), which trains one after this run.
"""

from __future__ import annotations

import pytest

from emr_ray.cluster import partitions, storage
from tests.fixtures.pipeline import GOOD, ROWS, dags_test

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runs(tabular_good_run):
    return {GOOD: tabular_good_run}


@pytest.fixture(scope="module")
def registry(stack):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=stack.tracking_uri)


def versions_by_partition(registry):
    return {v.tags["partition"]: v for v in registry.search_model_versions("name='tabular-mlp'")}


def test_the_run_succeeds(runs):
    for date, run in runs.items():
        assert run.returncode == 0, f"{date}:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"


def test_staged_partition_is_committed_with_row_counts(stack, runs):
    manifest = partitions.require_current(storage.join(stack.staging_uri, "tabular", f"dt={GOOD}")).manifest
    assert manifest["rows_in"] == ROWS
    rows = {name: out["rows"] for name, out in manifest["outputs"].items()}
    assert set(rows) == {"train", "test"} and sum(rows.values()) == ROWS
    assert 0.1 < rows["test"] / ROWS < 0.3
    assert [c for c, _ in manifest["outputs"]["train"]["schema"]] == [f"f{i:02d}" for i in range(16)] + [
        "label"
    ]


def test_progress_is_in_the_task_log(runs):
    log = runs[GOOD].stdout + runs[GOOD].stderr
    assert "Read 4000 rows" in log
    assert "epoch 5/5" in log


def test_model_versions_are_tagged_with_run_and_partition(registry, runs):
    versions = versions_by_partition(registry)
    good = versions[GOOD]
    assert good.tags["airflow.dag_id"] == "retrain_tabular"
    assert good.tags["airflow.run_id"].startswith("manual__")
    assert good.tags["data_uri"].endswith(f"/tabular/dt={GOOD}")
    assert registry.get_run(good.run_id).data.metrics["test_accuracy"] > 0.8


def test_the_version_names_the_generation_it_trained_on_and_that_is_what_the_training_read(
    stack, registry, runs
):
    good = versions_by_partition(registry)[GOOD]
    staged = partitions.pinned(good.tags["data_uri"], good.tags["generation"], stack.storage_options())
    assert staged.manifest["producer"]["airflow.run_id"] == good.tags["airflow.run_id"]
    params = registry.get_run(good.run_id).data.params
    assert params["data.train"] == staged.output_uri("train") and params["data.test"] == staged.output_uri(
        "test"
    )
    trained_rows = sum(int(m.value) for m in registry.get_metric_history(good.run_id, "train_rows")[-1:])
    assert (
        trained_rows == staged.outputs["train"]["rows"] - staged.outputs["train"]["rows"] % 2
    )  # 2 equal shards


def test_the_training_run_has_every_epoch_the_model_and_a_loss_curve(registry, runs):
    run = registry.get_run(versions_by_partition(registry)[GOOD].run_id)
    assert run.data.params["epochs"] == "5" and run.data.params["scaling.num_workers"] == "2"
    history = registry.get_metric_history(run.info.run_id, "test_loss")
    assert sorted(m.step for m in history) == [0, 1, 2, 3, 4]
    artifacts = {a.path for a in registry.list_artifacts(run.info.run_id)}
    assert "loss_curve.png" in artifacts
    curve = registry.download_artifacts(run.info.run_id, "loss_curve.png")
    with open(curve, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    logged = registry.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert any(m.source_run_id == run.info.run_id and m.name == "model" for m in logged), "no model logged"


def test_the_first_version_becomes_champion_and_challenger(registry, runs):
    versions = versions_by_partition(registry)
    aliases = registry.get_registered_model("tabular-mlp").aliases
    assert aliases["champion"] == versions[GOOD].version == aliases["challenger"]


def test_champion_loads_and_predicts(stack, registry, runs):
    import mlflow
    import numpy as np

    mlflow.set_tracking_uri(stack.tracking_uri)
    try:
        model = mlflow.pyfunc.load_model("models:/tabular-mlp@champion")
        predictions = model.predict(np.zeros((4, 16), dtype=np.float32))
    finally:
        mlflow.set_tracking_uri("")
    assert np.asarray(predictions).shape == (4, 2)


def test_registration_emits_the_model_asset_event(runs):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.uri == "x-mlflow://models/tabular-mlp")
            .all()
        )
        extras = [event.extra for event in events]
    assert any(str(e["version"]) == "1" and e["promoted"] and e["value"] > 0.8 for e in extras)


def test_downstream_scoring_dag_scores_on_the_cluster_with_the_champion(stack, runs, registry):
    """``score_tabular`` resolves the champion once and scores its test rows on the Ray cluster
    (``RayBatchPredictOperator``): the predictions generation holds every input row, once, each with
    its prediction, made by that version, and records which input generation it read."""
    import pyarrow.parquet as pq

    run = dags_test(stack, GOOD, dag_id="score_tabular")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    scored = partitions.require_current(storage.join(stack.staging_uri, "predictions", f"dt={GOOD}"))
    staged = partitions.require_current(storage.join(stack.staging_uri, "tabular", f"dt={GOOD}"))
    champion = registry.get_model_version_by_alias("tabular-mlp", "champion")
    manifest = scored.manifest
    assert (manifest["version"], manifest["input_generation"]) == (
        str(champion.version),  # the manifest's text, whatever type this MLflow client gives
        champion.tags["generation"],
    )
    assert manifest["outputs"]["predictions"]["rows"] == staged.outputs["test"]["rows"]
    table = pq.read_table([path for path, _ in partitions.dataset_files(scored, "predictions")])
    test = pq.read_table([path for path, _ in partitions.dataset_files(staged, "test")])
    assert sorted(table.column("f00").to_pylist()) == sorted(test.column("f00").to_pylist())  # the same rows
    accuracy = (table.column("prediction").to_numpy() == table.column("label").to_numpy()).mean()
    assert accuracy > 0.8
