"""emr_ray.lineage: URI -> OpenLineage dataset naming, the lineage each operator builds, and that lineage
never fails a task nor needs the OpenLineage provider.

The same lineage from a real ``airflow dags test`` run, through the provider's file transport, is in
``tests/integration/test_lineage.py``.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from emr_ray import lineage
from emr_ray.cluster import storage
from emr_ray.cluster.results import SparkResult, TrainResult
from emr_ray.lineage import DatasetId

BUCKET = "emr-ray-demo-1250000000"
GENERATION = "g20261130T010203-abcdef12"
STAGED = f"file:///srv/staging/tabular/dt=2026-11-30/_generations/{GENERATION}"


# -- naming -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (f"cos://{BUCKET}/raw/dt=2026-11-30", DatasetId(f"cos://{BUCKET}", "raw/dt=2026-11-30")),
        (f"cos://{BUCKET}/raw/dt=2026-11-30/", DatasetId(f"cos://{BUCKET}", "raw/dt=2026-11-30")),
        (f"cos://{BUCKET}", DatasetId(f"cos://{BUCKET}", "/")),
        ("file:///srv/staging/tabular/dt=2026-11-30", DatasetId("file", "/srv/staging/tabular/dt=2026-11-30")),
        ("file://localhost/srv/x/", DatasetId("file", "/srv/x")),
        ("hdfs://namenode:8020/warehouse/raw/dt=2026-11-30",
         DatasetId("hdfs://namenode:8020", "/warehouse/raw/dt=2026-11-30")),
        ("hdfs://namenode/warehouse", DatasetId("hdfs://namenode", "/warehouse")),
    ],
)  # fmt: skip
def test_storage_uris_follow_openlineage_naming_for_object_storage_and_files(uri, expected):
    assert lineage.dataset_id(uri) == expected


def test_credentials_in_a_uri_never_reach_the_dataset_name():
    assert lineage.dataset_id(f"cos://AKID:s3cret@{BUCKET}/raw") == DatasetId(f"cos://{BUCKET}", "raw")
    assert lineage.dataset_id("hdfs://etl:pw@nn:8020/x") == DatasetId("hdfs://nn:8020", "/x")


def test_a_uri_the_provider_cannot_open_is_refused_as_storage_does():
    with pytest.raises(storage.StorageError, match="scheme 's3'"):
        lineage.dataset_id("s3://bucket/raw")


@pytest.mark.parametrize(
    ("uri", "namespace"),
    [
        ("http://127.0.0.1:5000", "mlflow://127.0.0.1:5000"),
        ("https://MLflow.Example.com/", "mlflow://mlflow.example.com"),
        ("https://admin:hunter2@mlflow.example.com:8443/prefix/", "mlflow://mlflow.example.com:8443/prefix"),
        ("sqlite:////srv/mlflow/mlflow.db", "mlflow+sqlite:////srv/mlflow/mlflow.db"),
        ("postgresql://mlflow:hunter2@db:5432/mlflow?sslmode=require&password=hunter2",
         "mlflow+postgresql://db:5432/mlflow"),
        ("file:///srv/mlruns", "mlflow+file:///srv/mlruns"),
        ("/srv/mlruns", "mlflow+file:///srv/mlruns"),
        ("databricks", "mlflow+databricks"),
    ],
)  # fmt: skip
def test_mlflow_namespace_names_the_store_without_credentials(uri, namespace):
    assert lineage.mlflow_namespace(uri) == namespace


def test_models_are_named_by_mlflow_uris_on_the_tracking_and_registry_namespaces():
    assert lineage.run_model_id("http://h:5000", "abc123") == DatasetId(
        "mlflow://h:5000", "runs:/abc123/model"
    )
    assert lineage.run_model_id("http://h:5000", "abc", "/net/") == DatasetId(
        "mlflow://h:5000", "runs:/abc/net"
    )
    assert lineage.model_version_id("http://h:5000", "tabular-mlp", 3) == DatasetId(
        "mlflow://h:5000", "models:/tabular-mlp/3"
    )


# -- builders (need the OpenLineage provider) --------------------------------------------------------
def _ol():
    pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is optional")
    from openlineage.client.serde import Serde

    return Serde


def _ids(datasets) -> list[DatasetId]:
    return [DatasetId(d.namespace, d.name) for d in datasets]


SPARK_RESULT = SparkResult(
    partition="2026-11-30",
    input_uri=f"cos://{BUCKET}/raw/dt=2026-11-30",
    output_uri="file:///srv/staging/tabular/dt=2026-11-30",
    generation=GENERATION,
    rows_in=100,
    rows_out={"train": 80, "test": 20},
    outputs={"train": f"{STAGED}/train", "test": f"{STAGED}/test"},
)
MANIFEST = {
    "input_files": [[f"{BUCKET}/raw/dt=2026-11-30/part-0.parquet", 1000],
                    [f"{BUCKET}/raw/dt=2026-11-30/part-1.parquet", 500]],
    "outputs": {
        name: {"rows": rows, "schema": [["f00", "double"], ["label", "bigint"]],
               "files": [{"path": f"_generations/{GENERATION}/{name}/part-0.parquet", "size": 10 * rows}]}
        for name, rows in (("train", 80), ("test", 20))
    },
}  # fmt: skip


def trained(run_id: str, **fields) -> TrainResult:
    """A training's result with what lineage reads (its run, checkpoint and metrics)."""
    defaults = {"tracking_uri": "http://ml:5000", "run_name": "r", "checkpoint_uri": "", "final_metrics": {}}
    return TrainResult(mlflow_run_id=run_id, **(defaults | fields))


def test_spark_lineage_reads_the_raw_partition_and_writes_the_committed_generation():
    serde = _ol()
    ol = lineage.spark_lineage(
        input_uri="unused", result=SPARK_RESULT, manifest=MANIFEST, submission_id="sub-1"
    )
    assert _ids(ol.inputs) == [DatasetId(f"cos://{BUCKET}", "raw/dt=2026-11-30")]
    assert ol.inputs[0].inputFacets["inputStatistics"].rowCount == 100
    assert ol.inputs[0].inputFacets["inputStatistics"].size == 1500
    assert ol.inputs[0].inputFacets["inputStatistics"].fileCount == 2
    assert _ids(ol.outputs) == [
        DatasetId("file", f"/srv/staging/tabular/dt=2026-11-30/_generations/{GENERATION}/test"),
        DatasetId("file", f"/srv/staging/tabular/dt=2026-11-30/_generations/{GENERATION}/train"),
    ]
    train = json.loads(serde.to_json(ol.outputs[1]))
    assert train["facets"]["version"]["datasetVersion"] == GENERATION
    assert [(f["name"], f["type"]) for f in train["facets"]["schema"]["fields"]] == [
        ("f00", "double"),
        ("label", "bigint"),
    ]
    assert train["facets"]["symlinks"]["identifiers"] == [
        {"namespace": "file", "name": "/srv/staging/tabular/dt=2026-11-30", "type": "PARTITION"}
    ]
    assert train["outputFacets"]["outputStatistics"] == {
        **train["outputFacets"]["outputStatistics"],
        "rowCount": 80,
        "size": 800,
        "fileCount": 1,
    }
    assert ol.run_facets["externalQuery"].externalQueryId == "sub-1"


def test_spark_lineage_without_a_manifest_still_has_row_counts_and_without_a_result_only_the_input():
    _ol()
    ol = lineage.spark_lineage(input_uri="unused", result=SPARK_RESULT)
    assert [o.outputFacets["outputStatistics"].rowCount for o in ol.outputs] == [20, 80]
    assert all("schema" not in o.facets for o in ol.outputs)
    failed = lineage.spark_lineage(input_uri=f"cos://{BUCKET}/raw/dt=2026-11-30", result=None)
    assert _ids(failed.inputs) == [DatasetId(f"cos://{BUCKET}", "raw/dt=2026-11-30")] and failed.outputs == []
    dry = lineage.spark_lineage(
        input_uri="unused",
        result=SparkResult(
            partition="2026-11-30", input_uri=SPARK_RESULT.input_uri, rows_in=7, validated=True
        ),
    )
    assert dry.outputs == [] and dry.inputs[0].inputFacets["inputStatistics"].rowCount == 7


def test_training_reads_what_preprocessing_wrote_and_writes_its_runs_model():
    _ol()
    spark = lineage.spark_lineage(input_uri="unused", result=SPARK_RESULT)
    result = trained("run42", checkpoint_uri="file:///ck/checkpoints/d/r/train",
                     final_metrics={"test_accuracy": 0.93, "test_loss": 0.2, "note": "x"})  # fmt: skip
    ol = lineage.train_lineage(
        datasets=SPARK_RESULT.outputs or {},
        result=result,
        tracking_uri="https://u:pw@ml:5000",
        submission_id="s",
    )
    assert sorted(_ids(ol.inputs)) == sorted(_ids(spark.outputs))
    assert {i.facets["version"].datasetVersion for i in ol.inputs} == {GENERATION}
    assert _ids(ol.outputs) == [
        DatasetId("mlflow://ml:5000", "runs:/run42/model"),
        DatasetId("file", "/ck/checkpoints/d/r/train"),
    ]
    model = ol.outputs[0].facets
    assert model["datasetType"].datasetType == "MODEL" and model["version"].datasetVersion == "run42"
    assert {(t.key, t.value) for t in model["tags"].tags} == {
        ("mlflow.run_id", "run42"),
        ("metric.test_accuracy", "0.93"),
        ("metric.test_loss", "0.2"),
    }
    assert ol.run_facets["externalQuery"].externalQueryId == "run42"
    assert ol.run_facets["externalQuery"].source == "mlflow"


def test_registration_reads_the_runs_model_and_writes_the_version_with_its_aliases_and_decision():
    serde = _ol()
    result = {"model_name": "tabular-mlp", "version": "3", "run_id": "run42", "metric": "test_accuracy",
              "value": 0.93, "promoted": True, "aliases": ["challenger", "champion"], "reused": False,
              "reason": "0.93 beats champion v2's 0.91"}  # fmt: skip
    ol = lineage.register_lineage(
        run_id="run42", artifact_path="model", tracking_uri="http://ml:5000", registry_uri="http://ml:5000",
        result=result,
    )  # fmt: skip
    train = lineage.train_lineage(datasets={}, result=trained("run42"), tracking_uri="http://ml:5000")
    assert _ids(ol.inputs) == _ids(train.outputs) == [DatasetId("mlflow://ml:5000", "runs:/run42/model")]
    assert _ids(ol.outputs) == [DatasetId("mlflow://ml:5000", "models:/tabular-mlp/3")]
    version = json.loads(serde.to_json(ol.outputs[0]))["facets"]
    tags = {(t["key"], t["value"]) for t in version["tags"]["tags"]}
    assert {("mlflow.alias", "champion"), ("mlflow.alias", "challenger"), ("promoted", "true")} <= tags
    assert ("decision", "0.93 beats champion v2's 0.91") in tags and ("metric.test_accuracy", "0.93") in tags
    assert version["version"]["datasetVersion"] == "3"
    assert version["symlinks"]["identifiers"][0]["name"] == "models:/tabular-mlp"


def test_registering_nothing_reports_the_input_alone():
    _ol()
    skipped = {"model_name": "m", "version": None, "run_id": "r", "promoted": False, "aliases": []}
    ol = lineage.register_lineage(
        run_id="r", artifact_path="model", tracking_uri="http://h", registry_uri="http://h", result=skipped
    )
    assert _ids(ol.inputs) == [DatasetId("mlflow://h", "runs:/r/model")] and ol.outputs == []


def test_no_secret_of_the_uris_reaches_any_facet():
    serde = _ol()
    uri = "https://admin:hunter2@ml.example.com/?token=hunter2"
    events = [
        lineage.train_lineage(datasets={"train": f"cos://AKID:hunter2@{BUCKET}/s/x"},
                              result=trained("r"), tracking_uri=uri),
        lineage.register_lineage(run_id="r", artifact_path="model", tracking_uri=uri, registry_uri=uri,
                                 result={"model_name": "m", "version": 1, "aliases": ["champion"]}),
    ]  # fmt: skip
    text = "".join(serde.to_json(d) for ol in events for d in [*ol.inputs, *ol.outputs])
    assert "hunter2" not in text and "admin" not in text and "AKID" not in text


# -- never failing, never required --------------------------------------------------------------------
def test_collect_logs_a_failing_builder_and_returns_nothing(caplog):
    log = logging.getLogger("test.lineage")

    def broken():
        raise KeyError("outputs")

    with caplog.at_level(logging.WARNING, logger="test.lineage"):
        assert lineage.collect(log, "preprocess", broken) is None
    assert "Could not build the OpenLineage lineage of preprocess" in caplog.text

    def absent():
        raise ImportError("No module named 'openlineage'")

    assert lineage.collect(log, "preprocess", absent) is None


def test_operators_import_and_report_nothing_without_the_openlineage_packages(fresh_python):
    """A subprocess where importing openlineage fails, as on an install without the provider."""
    code = """
import sys
for name in ("openlineage", "airflow.providers.openlineage.extractors"):
    sys.modules[name] = None  # any import of them raises ImportError
from emr_ray.operators.mlflow import MLflowRegisterOperator
from emr_ray.operators.raydp import RayDPSparkOperator
from emr_ray.operators.torch import TorchTrainOperator
spark = RayDPSparkOperator(task_id="p", preprocess="m:f", input_uri="cos://b/raw", output_uri="file:///s",
                           partition="2026-11-30")
spark._lineage_result = {"input_uri": "cos://b/raw/dt=2026-11-30", "outputs": {"train": "file:///s/t"}}
train = TorchTrainOperator(task_id="t", train_loop="m:f", datasets={"train": "file:///s/t"},
                           storage_path="file:///ck")
register = MLflowRegisterOperator(task_id="r", model_name="m", run_id="r1")
assert [op.get_openlineage_facets_on_complete(None) for op in (spark, train, register)] == [None] * 3
"""
    fresh_python.run(
        code, env={"AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps({"conn_type": "mlflow", "host": "http://h"})}
    )


def test_importing_the_operators_loads_no_openlineage(fresh_python):
    """(Airflow's configuration itself reads the provider's ``get_provider_info``; the client and the
    extractors are what this package could pull in.)"""
    code = (
        "import sys, emr_ray.lineage, emr_ray.operators.raydp, emr_ray.operators.torch, emr_ray.operators.mlflow;"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'openlineage' or 'openlineage.extractors' in m];"
        "assert not bad, bad"
    )
    fresh_python.run(code)


def test_a_spark_task_that_failed_reports_its_input_and_a_manifest_it_cannot_read_only_costs_facets(capsys):
    _ol()
    from emr_ray.operators.raydp import RayDPSparkOperator

    op = RayDPSparkOperator(task_id="preprocess", preprocess="m:f", input_uri=f"cos://{BUCKET}/raw",
                            output_uri="file:///nonexistent/staging", partition="2026-11-30")  # fmt: skip
    failed = op.get_openlineage_facets_on_complete(None)
    assert _ids(failed.inputs) == [DatasetId(f"cos://{BUCKET}", "raw/dt=2026-11-30")] and failed.outputs == []
    op._lineage_result = dataclasses.replace(
        SPARK_RESULT, output_uri="file:///nonexistent/staging/dt=2026-11-30"
    )
    done = op.get_openlineage_facets_on_complete(None)
    assert len(done.outputs) == 2 and all("schema" not in o.facets for o in done.outputs)
    assert "could not read the manifest" in capsys.readouterr().out  # the task logger writes to stdout
