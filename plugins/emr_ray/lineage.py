"""OpenLineage for the provider's operators: dataset names from URIs, and the lineage each step reports.

:class:`~emr_ray.operators.raydp.RayDPSparkOperator`, :class:`~emr_ray.operators.torch.TorchTrainOperator`
and :class:`~emr_ray.operators.mlflow.MLflowRegisterOperator` return their lineage from
``get_openlineage_facets_on_complete`` when Airflow's OpenLineage provider
(``apache-airflow-providers-openlineage``) is installed and configured, so a lineage backend sees the
chain from the raw partition to the model version::

    cos://bucket raw/dt=D  ->  preprocess  ->  <staging>/dt=D/_generations/<g>/{train,test}
        ->  train  ->  mlflow://host runs:/<run id>/model  ->  register  ->  mlflow://host models:/<name>/<v>

Without the provider the operators work as before: this module imports the openlineage packages only
inside the builders, and :func:`collect` turns any error into a logged warning, never a failed task.

Naming follows OpenLineage's conventions for object storage and file systems (namespace: scheme and
authority; name: the path), one place for every operator (:func:`dataset_id`):

=====================================  ===========================  ======================================
URI                                    namespace                    name
=====================================  ===========================  ======================================
``cos://bucket/raw/dt=2026-11-30``     ``cos://bucket``             ``raw/dt=2026-11-30``
``file:///data/staging/x``             ``file``                     ``/data/staging/x``
``hdfs://namenode:8020/data/x``        ``hdfs://namenode:8020``     ``/data/x``
a run's model (MLflow)                 :func:`mlflow_namespace`     ``runs:/<run id>/<artifact path>``
a model version (MLflow)               :func:`mlflow_namespace`     ``models:/<name>/<version>``
=====================================  ===========================  ======================================

No facet carries a secret: names and namespaces drop ``user:password@``, query strings and fragments,
and the facets hold only what the tasks' XComs already show (row counts, schemas, generations, run
ids, versions, aliases).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

from emr_ray.cluster import partitions, storage
from emr_ray.cluster.results import SparkResult, TrainResult

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

#: ``source`` of the tags this provider puts on datasets
TAG_SOURCE = "EMR_RAY"
#: what the OpenLineage ``datasetType`` facet says of MLflow models
MODEL = "MODEL"


class DatasetId(NamedTuple):
    """An OpenLineage dataset's identity."""

    namespace: str
    name: str


# -- naming (pure: no openlineage needed) ---------------------------------------------------------
def dataset_id(uri: str) -> DatasetId:
    """The OpenLineage namespace and name of a storage URI (``cos://``, ``file://``, ``hdfs://``).

    :param uri: a URI :func:`emr_ray.cluster.storage.split_uri` accepts; anything else raises its ``StorageError``.
    """
    scheme, path = storage.split_uri(uri)
    if scheme == "file":
        return DatasetId("file", path)
    authority = _authority(uri)
    if scheme == "cos":
        key = path.partition("/")[2].strip("/")
        return DatasetId(f"cos://{authority}", key or "/")
    return DatasetId(f"hdfs://{authority}", path or "/")


def mlflow_namespace(uri: str) -> str:
    """The namespace of what an MLflow tracking server or registry holds (runs, models, versions).

    ``http(s)://[user:pw@]host:port[/path]`` becomes ``mlflow://host:port[/path]``; a store named by
    another scheme keeps it: ``sqlite:////srv/mlflow.db`` -> ``mlflow+sqlite:////srv/mlflow.db``,
    ``postgresql://u:pw@db:5432/mlflow`` -> ``mlflow+postgresql://db:5432/mlflow``. Credentials,
    query strings and fragments never appear.

    :param uri: the tracking (or registry) URI.
    """
    uri = uri.strip()
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if not scheme:  # a bare path (MLflow's file store), or a name such as "databricks"
        return (
            f"mlflow+file://{os.path.abspath(uri)}" if "/" in uri or uri.startswith(".") else f"mlflow+{uri}"
        )
    path = parts.path.rstrip("/") if parts.netloc else parts.path
    if scheme in ("http", "https"):
        return f"mlflow://{_authority(uri)}{path}"
    return f"mlflow+{scheme}://{_authority(uri)}{path}"


def run_model_id(tracking_uri: str, run_id: str, artifact_path: str = "model") -> DatasetId:
    """The model an MLflow run logged (``runs:/<run id>/<artifact path>``, MLflow's own URI)."""
    return DatasetId(mlflow_namespace(tracking_uri), f"runs:/{run_id}/{artifact_path.strip('/')}")


def model_version_id(registry_uri: str, name: str, version: str | int) -> DatasetId:
    """A registered model version (``models:/<name>/<version>``, MLflow's own URI)."""
    return DatasetId(mlflow_namespace(registry_uri), f"models:/{name}/{version}")


def _authority(uri: str) -> str:
    """``host[:port]`` of a URI, without ``user:password@``."""
    parts = urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]
    return host.lower() if parts.scheme.lower() in ("http", "https") else host


# -- lineage builders (import openlineage) ---------------------------------------------------------
def collect(log: logging.Logger | Any, task_id: str, build: Callable[[], OperatorLineage]) -> Any:
    """``build()``, or None when the OpenLineage provider is absent or building fails (logged): lineage
    never fails a task."""
    try:
        return build()
    except ImportError as e:
        log.debug("No OpenLineage lineage for %s: %s", task_id, e)
    except Exception:
        log.warning(
            "Could not build the OpenLineage lineage of %s; the task is not affected", task_id, exc_info=True
        )
    return None


def spark_lineage(
    *,
    input_uri: str,
    result: SparkResult | None,
    manifest: Mapping[str, Any] | None = None,
    submission_id: str | None = None,
) -> OperatorLineage:
    """The Spark step: the raw partition in; out, each output of the generation it committed.

    :param input_uri: the input partition (``<input_uri>/dt=<partition>``), used when ``result`` is None.
    :param result: the task's result (``input_uri``, ``rows_in``, ``generation``, ``outputs``, ``rows_out``);
        None when the task failed (then only the input is reported).
    :param manifest: the committed generation's manifest, for schemas, file counts and sizes (optional).
    :param submission_id: the Ray job's submission id (an ``externalQuery`` run facet).
    """
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
    from openlineage.client.generated.input_statistics_input_dataset import (
        InputStatisticsInputDatasetFacet,
    )
    from openlineage.client.generated.output_statistics_output_dataset import (
        OutputStatisticsOutputDatasetFacet,
    )
    from openlineage.client.generated.symlinks_dataset import Identifier, SymlinksDatasetFacet

    manifest = manifest or {}
    source = dataset_id(str(result.input_uri if result else input_uri))
    input_files = manifest.get("input_files") or []
    read = InputStatisticsInputDatasetFacet(
        rowCount=_int(result.rows_in if result else None),
        size=sum(int(size) for _, size in input_files) if input_files else None,
        fileCount=len(input_files) if input_files else None,
    )
    inputs = [InputDataset(source.namespace, source.name, inputFacets=_present({"inputStatistics": read}))]

    outputs = []
    generation = result.generation if result else None
    described = manifest.get("outputs") or {}
    rows_out = (result.rows_out if result else None) or {}
    for output, uri in sorted(((result.outputs if result else None) or {}).items()):
        target = dataset_id(str(uri))
        entry = described.get(output) or {}
        files = entry.get("files") or []
        facets: dict[str, Any] = {}
        if schema := _schema_facet(entry.get("schema")):
            facets["schema"] = schema
        if generation:
            facets["version"] = DatasetVersionDatasetFacet(datasetVersion=str(generation))
        if result and result.output_uri:
            partition = dataset_id(result.output_uri)
            facets["symlinks"] = SymlinksDatasetFacet(
                identifiers=[Identifier(partition.namespace, partition.name, "PARTITION")]
            )
        written = OutputStatisticsOutputDatasetFacet(
            rowCount=_int(rows_out.get(output, entry.get("rows"))),
            size=sum(int(f["size"]) for f in files) if files else None,
            fileCount=len(files) if files else None,
        )
        outputs.append(
            OutputDataset(
                target.namespace,
                target.name,
                facets=facets,
                outputFacets=_present({"outputStatistics": written}),
            )
        )
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=_ray_job_facet(submission_id))


def train_lineage(
    *,
    datasets: Mapping[str, str],
    result: TrainResult | None,
    tracking_uri: str | None,
    artifact_path: str = "model",
    submission_id: str | None = None,
) -> OperatorLineage:
    """The training step: in, the pinned generation outputs it read; out, the model its MLflow run
    logged (``runs:/<run id>/model``) and its checkpoints.

    :param datasets: the rendered ``datasets`` argument (name -> URI of a committed generation's output).
    :param result: the task's result (``mlflow_run_id``, ``checkpoint_uri``, ``final_metrics``); None when
        the task failed (then only the inputs are reported).
    :param tracking_uri: the MLflow tracking URI the job logged to.
    :param artifact_path: the name the job logs the model under.
    :param submission_id: the Ray job's submission id (the ``externalQuery`` run facet names the MLflow
        run instead once there is one).
    """
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
    from openlineage.client.generated.external_query_run import ExternalQueryRunFacet

    inputs = []
    for _, uri in sorted(datasets.items()):
        source = dataset_id(str(uri))
        parts = partitions.split_output_uri(str(uri))
        facets: dict[str, Any] = {}
        if parts:
            facets["version"] = DatasetVersionDatasetFacet(datasetVersion=parts[1])
        inputs.append(InputDataset(source.namespace, source.name, facets=facets))

    outputs = []
    run_facets: dict[str, Any] = _ray_job_facet(submission_id)
    run_id = result.mlflow_run_id if result else None
    if result and run_id and tracking_uri:
        model = run_model_id(tracking_uri, str(run_id), artifact_path)
        metrics = {k: v for k, v in result.final_metrics.items() if _is_number(v)}
        tags = {"mlflow.run_id": str(run_id)} | {f"metric.{k}": f"{v:g}" for k, v in sorted(metrics.items())}
        outputs.append(OutputDataset(model.namespace, model.name, facets=_model_facets(str(run_id), tags)))
        run_facets["externalQuery"] = ExternalQueryRunFacet(externalQueryId=str(run_id), source="mlflow")
    if checkpoint := (result.checkpoint_uri if result else None):
        try:
            target = dataset_id(str(checkpoint))
        except storage.StorageError:
            pass  # a checkpoint somewhere this provider does not name (a Ray Train default): not reported
        else:
            outputs.append(OutputDataset(target.namespace, target.name))
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=run_facets)


def register_lineage(
    *,
    run_id: str,
    artifact_path: str,
    tracking_uri: str,
    registry_uri: str,
    result: Mapping[str, Any] | None,
) -> OperatorLineage:
    """The registration: in, the run's model; out, the model version with its aliases and the decision.

    :param run_id: the MLflow run whose model is registered.
    :param artifact_path: the name the run logged the model under.
    :param tracking_uri: where the run lives.
    :param registry_uri: where the model version lives.
    :param result: the task's XCom (``model_name``, ``version``, ``aliases``, ``promoted``, ``reason``,
        ``metric``, ``value``, ``reused``); no output when it registered nothing or failed.
    """
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.generated.symlinks_dataset import Identifier, SymlinksDatasetFacet

    source = run_model_id(tracking_uri, run_id, artifact_path)
    inputs = [InputDataset(source.namespace, source.name, facets=_model_facets(run_id, {}))]
    result = result or {}
    outputs = []
    if result.get("version") is not None:
        name, version = str(result["model_name"]), str(result["version"])
        target = model_version_id(registry_uri, name, version)
        tags = {
            "mlflow.run_id": run_id,
            "promoted": str(bool(result.get("promoted"))).lower(),
            "reused": str(bool(result.get("reused"))).lower(),
        }
        if result.get("metric") and _is_number(result.get("value")):
            tags[f"metric.{result['metric']}"] = f"{result['value']:g}"
        if result.get("reason"):
            tags["decision"] = str(result["reason"])
        facets = _model_facets(version, tags, aliases=result.get("aliases") or [])
        facets["symlinks"] = SymlinksDatasetFacet(
            identifiers=[Identifier(target.namespace, f"models:/{name}", "REGISTERED_MODEL")]
        )
        outputs.append(OutputDataset(target.namespace, target.name, facets=facets))
    return OperatorLineage(inputs=inputs, outputs=outputs)


# -- facet helpers -------------------------------------------------------------------------------
def _model_facets(version: str, tags: Mapping[str, str], aliases: list[str] | tuple = ()) -> dict[str, Any]:
    """``datasetType`` MODEL, ``version`` and ``tags`` (one ``mlflow.alias`` tag per alias) of a model."""
    from openlineage.client.generated.dataset_type_dataset import DatasetTypeDatasetFacet
    from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
    from openlineage.client.generated.tags_dataset import TagsDatasetFacet, TagsDatasetFacetFields

    fields = [TagsDatasetFacetFields(key, value, TAG_SOURCE) for key, value in tags.items()]
    fields += [TagsDatasetFacetFields("mlflow.alias", str(alias), TAG_SOURCE) for alias in aliases]
    facets: dict[str, Any] = {
        "datasetType": DatasetTypeDatasetFacet(datasetType=MODEL),
        "version": DatasetVersionDatasetFacet(datasetVersion=version),
    }
    if fields:
        facets["tags"] = TagsDatasetFacet(tags=fields)
    return facets


def _schema_facet(columns: Any) -> Any:
    """A ``schema`` facet from a manifest's ``[[column, type], ...]``, or None."""
    from openlineage.client.generated.schema_dataset import SchemaDatasetFacet, SchemaDatasetFacetFields

    if not columns:
        return None
    return SchemaDatasetFacet(
        fields=[
            SchemaDatasetFacetFields(name=str(name), type=str(kind), ordinal_position=i)
            for i, (name, kind) in enumerate(columns, start=1)
        ]
    )


def _ray_job_facet(submission_id: str | None) -> dict[str, Any]:
    """An ``externalQuery`` run facet naming the Ray job (its submission id), or nothing."""
    if not submission_id:
        return {}
    from openlineage.client.generated.external_query_run import ExternalQueryRunFacet

    return {"externalQuery": ExternalQueryRunFacet(externalQueryId=submission_id, source="ray")}


def _present(facets: dict[str, Any]) -> dict[str, Any]:
    """The statistics facets that have at least one figure."""
    return {k: f for k, f in facets.items() if any(v is not None for v in (f.rowCount, f.size, f.fileCount))}


def _int(value: Any) -> int | None:
    return int(value) if _is_number(value) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
