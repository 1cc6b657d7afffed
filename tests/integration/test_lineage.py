"""OpenLineage from a real run: the session's ``airflow dags test retrain_tabular`` (``tabular_good_run``)
writes its events through the OpenLineage provider's file transport (``LocalStack.dags_test_env``), and a
lineage backend reading them sees the chain raw partition -> staged generation -> MLflow run's model ->
model version.
"""

from __future__ import annotations

import json

import pytest

from devstack.constants import BUCKET, SECRET_ID, SECRET_KEY
from emr_ray import lineage
from tests.fixtures.pipeline import GOOD

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def events(stack, tabular_good_run) -> dict[str, dict]:
    """The COMPLETE event of each task of the good run (the session's first run of GOOD), by task id."""
    assert tabular_good_run.returncode == 0, tabular_good_run.stdout[-4000:] + tabular_good_run.stderr[-4000:]
    path = stack.root / "openlineage.jsonl"
    assert path.is_file(), f"no OpenLineage events at {path}: is the provider installed and configured?"
    complete: dict[str, dict] = {}
    first_run = None
    for line in path.read_text().splitlines():
        event = json.loads(line)
        job = event.get("job", {}).get("name", "")
        dag_run = event.get("run", {}).get("facets", {}).get("airflow", {}).get("dagRun", {})
        if event.get("eventType") != "COMPLETE" or not job.startswith("retrain_tabular."):
            continue
        if not str(dag_run.get("logical_date", "")).startswith(GOOD):
            continue
        first_run = first_run or dag_run.get("run_id")
        if dag_run.get("run_id") == first_run:
            complete[job.partition(".")[2]] = event
    return complete


def ids(datasets: list[dict]) -> list[tuple[str, str]]:
    return sorted((d["namespace"], d["name"]) for d in datasets)


def test_every_step_reports_a_complete_event_in_the_configured_namespace(events, tabular_good_run):
    log = tabular_good_run.stdout + tabular_good_run.stderr
    assert "Could not build the OpenLineage lineage" not in log and "Lineage without schemas" not in log
    for task in ("preprocess", "train", "register"):
        assert task in events, f"no COMPLETE event for {task}; got {sorted(events)}"
        assert events[task]["job"]["namespace"] == "emr-ray-local"


def test_preprocess_reads_the_raw_partition_and_writes_the_committed_generation(stack, events):
    from emr_ray.cluster import partitions, storage

    event = events["preprocess"]
    assert ids(event["inputs"]) == [(f"cos://{BUCKET}", f"raw/dt={GOOD}")]
    assert event["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == 4000
    committed = partitions.require_current(storage.join(stack.staging_uri, "tabular", f"dt={GOOD}"))
    expected = [lineage.dataset_id(committed.output_uri(name)) for name in ("train", "test")]
    assert ids(event["outputs"]) == sorted(expected)
    for output in event["outputs"]:
        name = output["name"].rpartition("/")[2]
        assert output["facets"]["version"]["datasetVersion"] == committed.generation
        assert [f["name"] for f in output["facets"]["schema"]["fields"]] == [
            column for column, _ in committed.outputs[name]["schema"]
        ]
        stats = output["outputFacets"]["outputStatistics"]
        assert stats["rowCount"] == committed.outputs[name]["rows"]
        assert stats["fileCount"] == len(committed.outputs[name]["files"])


def test_train_reads_exactly_what_preprocess_wrote_and_writes_its_mlflow_runs_model(stack, events):
    assert ids(events["train"]["inputs"]) == ids(events["preprocess"]["outputs"])
    models = [o for o in events["train"]["outputs"] if o["name"].startswith("runs:/")]
    assert len(models) == 1
    run_id = models[0]["name"].split("/")[1]
    assert models[0]["namespace"] == lineage.mlflow_namespace(stack.tracking_uri)
    assert models[0]["facets"]["datasetType"]["datasetType"] == "MODEL"
    assert events["train"]["run"]["facets"]["externalQuery"]["externalQueryId"] == run_id


def test_register_reads_the_runs_model_and_writes_the_model_version_with_its_aliases(stack, events):
    import mlflow

    registry = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    version = next(
        v for v in registry.search_model_versions("name='tabular-mlp'") if v.tags.get("partition") == GOOD
    )
    train_model = [o for o in events["train"]["outputs"] if o["name"].startswith("runs:/")]
    assert (
        ids(events["register"]["inputs"])
        == ids(train_model)
        == [(lineage.mlflow_namespace(stack.tracking_uri), f"runs:/{version.run_id}/model")]
    )
    (output,) = events["register"]["outputs"]
    assert (output["namespace"], output["name"]) == (
        lineage.mlflow_namespace(stack.tracking_uri),
        f"models:/tabular-mlp/{version.version}",
    )
    tags = {(t["key"], t["value"]) for t in output["facets"]["tags"]["tags"]}
    assert {("mlflow.alias", "champion"), ("mlflow.alias", "challenger"), ("promoted", "true")} <= tags


def test_no_secret_is_in_any_event(stack, events):
    text = (stack.root / "openlineage.jsonl").read_text()
    conns = stack.connections()
    secrets = [SECRET_KEY, SECRET_ID, conns["ray_default"]["password"]]
    assert all(secret and secret not in text for secret in secrets)
