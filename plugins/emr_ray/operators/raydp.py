"""RayDPSparkOperator: a Spark preprocessing step on Ray (RayDP), run as a Ray job, committing one partition."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from emr_ray import lineage
from emr_ray.cluster import storage
from emr_ray.cluster.results import SparkResult
from emr_ray.cluster.spec import SparkJobSpec, SparkSettings
from emr_ray.identity import TaskIdentity
from emr_ray.operators.ray import RayJobOperator
from emr_ray.templating import as_bool


class RayDPSparkOperator(RayJobOperator):
    """Start Spark on Ray with ``raydp.init_spark``, preprocess one input partition, commit the output.

    The job reads ``<input_uri>/dt=<partition>`` (only if committed with ``_SUCCESS``), calls
    ``preprocess(df, config)`` (an import path to a function in ``include/``) and writes each returned
    DataFrame into a new generation of ``<output_uri>/dt=<partition>``, made current by one atomic
    commit (:mod:`emr_ray.cluster.partitions`): readers see the previous generation or this one, whole, never
    a mix, even with two writers or a crash. Spark is always stopped.
    The XCom: partition, input and output URIs, ``generation``, ``outputs`` (each output's URI inside
    that generation: pass them to the training task so it reads exactly this run's data), rows in and
    rows out per output, ``superseded_by`` when another writer committed later, and ``usage`` (what the
    job used, by phase: ``spark_start``, ``read``, ``compute``, ``write``, ``commit``; see
    :mod:`emr_ray.cluster.jobs._usage`).

    A retried or cleared task reuses an earlier try's job only while the raw partition is unchanged
    (its listing: names, sizes, ETags, times; :meth:`external_inputs`) and, once that job finished,
    while the generation it committed is still whole (:meth:`stale_result`): a partition landed
    again under the same URI is preprocessed again.

    Lineage (with Airflow's OpenLineage provider): the input partition in, each output of the committed
    generation out, with its schema, row and file counts and the generation as its version
    (:func:`emr_ray.lineage.spark_lineage`).

    :param preprocess: import path of the preprocessing function, ``include.preprocessing.tabular:standardize`` (templated).
    :param input_uri: root of the input dataset: ``cos://bucket/raw``, ``hdfs://...``, ``file:///...`` (templated).
    :param output_uri: root of the output dataset (templated).
    :param partition: the partition date, ``{{ ds }}`` by default (templated).
    :param config: passed to the preprocessing function (templated).
    :param app_name: Spark application name (templated); default ``<dag_id>-<task_id>``.
    :param num_executors: Spark executors (templated).
    :param executor_cores: cores per executor (templated).
    :param executor_memory: memory per executor, e.g. ``"1g"`` (templated).
    :param spark_configs: extra Spark settings (templated).
    :param placement_group_strategy: RayDP placement strategy (``PACK``, ``SPREAD``...; templated).
    :param spark_session: ``"job"`` (default): the job starts Spark on Ray and stops it; ``"shared"``: a
        warm session that outlives the job runs the preprocessing (one per configuration: Spark
        settings, Hadoop settings, shipped code; stopped after ``spark_idle_timeout`` seconds unused,
        and released earlier when a job needs its CPUs), which saves a partition Spark's start-up,
        about 18 s here (:mod:`emr_ray.cluster.jobs.spark_session`; templated).
    :param spark_idle_timeout: seconds a shared session waits unused before it stops (templated).
    :param keep_generations: deprecated, no effect: after its commit the job removes only abandoned
        writers' files; committed generations go only through the housekeeping, which asks the model
        registry (``PartitionHousekeepingOperator``'s ``keep`` and ``retention``).
    :param retain_generations: deprecated, no effect (as ``keep_generations``).
    :param validate_only: a quick dry run: check that the input partition is committed, matches the
        declared schema and count its rows from the Parquet footers; no Spark, nothing written
        (templated: ``"{{ params.dry_run }}"``).
    """

    template_fields: Sequence[str] = (
        *RayJobOperator.template_fields,
        "preprocess",
        "input_uri",
        "output_uri",
        "partition",
        "config",
        "app_name",
        "num_executors",
        "executor_cores",
        "executor_memory",
        "spark_configs",
        "placement_group_strategy",
        "validate_only",
        "spark_session",
        "spark_idle_timeout",
    )
    template_fields_renderers = {
        **RayJobOperator.template_fields_renderers,
        "config": "json",
        "spark_configs": "json",
    }
    job_module = "emr_ray.cluster.jobs.spark"
    result_type = SparkResult
    ui_color = "#fde8d0"

    def __init__(
        self,
        *,
        preprocess: str,
        input_uri: str,
        output_uri: str,
        partition: str = "{{ ds }}",
        config: dict[str, Any] | None = None,
        app_name: str | None = None,
        num_executors: int | str = 1,
        executor_cores: int | str = 1,
        executor_memory: str = "1g",
        spark_configs: dict[str, str] | None = None,
        placement_group_strategy: str | None = None,
        validate_only: bool | str = False,
        keep_generations: int = 3,
        retain_generations: timedelta | float = timedelta(days=7),
        spark_session: str = "job",
        spark_idle_timeout: int | str = 600,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if keep_generations != 3 or retain_generations != timedelta(days=7):
            warnings.warn(
                "RayDPSparkOperator's keep_generations and retain_generations have no effect: committed "
                "generations go only through the housekeeping, which asks the model registry; set keep and "
                "retention on PartitionHousekeepingOperator instead.",
                DeprecationWarning,
                stacklevel=2,
            )
        self.preprocess = preprocess
        self.input_uri = input_uri
        self.output_uri = output_uri
        self.partition = partition
        self.config = config or {}
        self.app_name = app_name
        self.num_executors = num_executors
        self.executor_cores = executor_cores
        self.executor_memory = executor_memory
        self.spark_configs = spark_configs or {}
        self.placement_group_strategy = placement_group_strategy
        self.validate_only = validate_only
        self.spark_session = spark_session
        self.spark_idle_timeout = spark_idle_timeout

    def build_spec(self, context: Any, identity: TaskIdentity) -> SparkJobSpec:
        partition = storage.validate_partition(str(self.partition))
        for uri in (self.input_uri, self.output_uri):
            storage.split_uri(uri)  # rejects bad schemes before any cluster work
        return SparkJobSpec(
            partition=partition,
            preprocess=self.preprocess,
            input_uri=storage.join(self.input_uri, f"dt={partition}"),
            output_uri=storage.join(self.output_uri, f"dt={partition}"),
            config=self.config,
            validate_only=as_bool(self.validate_only),
            spark=SparkSettings(
                app_name=self.app_name or f"{identity.dag_id}-{identity.task_id}",
                num_executors=int(self.num_executors),
                executor_cores=int(self.executor_cores),
                executor_memory=str(self.executor_memory),
                configs={k: str(v) for k, v in self.spark_configs.items()},
                placement_group_strategy=self.placement_group_strategy,
                session=str(self.spark_session),
                idle_timeout_s=int(self.spark_idle_timeout),
            ),
            tenant=self.tenant(),
        )

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the raw partition in, the committed generation's outputs out (never raises)."""
        result = getattr(self, "_lineage_result", None)

        def build() -> Any:
            input_uri = storage.join(str(self.input_uri), f"dt={self.partition}")
            manifest = self._lineage_manifest(result) if result and result.committed else None
            return lineage.spark_lineage(
                input_uri=input_uri, result=result, manifest=manifest, submission_id=self._submission_id
            )

        return lineage.collect(self.log, self.task_id, build)

    def _lineage_manifest(self, result: SparkResult) -> dict[str, Any] | None:
        """The committed generation's manifest (schemas, files), or None (logged) when it cannot be read."""
        from emr_ray.cluster import partitions

        uri = str(result.output_uri)
        try:
            options = self._storage_options(uri)
            return dict(partitions.pinned(uri, str(result.generation), options).manifest)
        except Exception as e:
            self.log.warning(
                "Lineage without schemas and file counts: could not read the manifest of "
                "generation %s of %s (%s)",
                result.generation,
                uri,
                e,
            )
            return None

    def finished(self, result: SparkResult, submission_id: str) -> SparkResult:
        """The job's result, with ``raw_input``: the raw partition's identity its job was submitted for
        (its metadata, so a reattached try reports what that job read). The model version records it
        (:mod:`emr_ray.receipt`); a duplicate arrival of the same listing then runs nothing
        (:mod:`emr_ray.arrivals`)."""
        if result.raw_input is not None:
            return result
        return dataclasses.replace(result, raw_input=self._raw_input(submission_id))

    def _raw_input(self, submission_id: str) -> str | None:
        import json

        from emr_ray.cluster.reuse import EXTERNAL_KEY, UNREADABLE

        try:
            recorded = json.loads(
                ((self.hook.get_job(submission_id) or {}).get("metadata") or {}).get(EXTERNAL_KEY) or "{}"
            )
        except Exception as e:  # a record, not a condition of the result
            self.log.warning("The raw partition's identity of job %s is unknown (%s)", submission_id, e)
            return None
        known = [str(v) for v in recorded.values() if not str(v).startswith(UNREADABLE)]
        return known[0] if len(known) == 1 else None

    def external_inputs(self, spec: Mapping[str, Any]) -> dict[str, str]:
        """The raw partition's identity (:func:`emr_ray.hooks.input_identity.partition_identity`: its
        files' names, sizes, ETags and times, from one listing): a partition landed again under the
        same URI is other input for the same spec."""
        from emr_ray.hooks.input_identity import partition_identity

        uri = str(spec["input_uri"])
        if storage.split_uri(uri)[0] == "cos":
            from emr_ray.hooks.cos import COSHook

            return {f"the raw partition {uri}": partition_identity(uri, cos_hook=COSHook(self.cos_conn_id))}
        return {f"the raw partition {uri}": partition_identity(uri, options=self._storage_options(uri))}

    def stale_result(self, spec: Mapping[str, Any], result: SparkResult) -> str | None:
        """A finished preprocessing is reused only while the generation it committed is still whole
        (committed, every file of its manifest there): reusing a pruned one hands the training a
        generation it cannot read."""
        from emr_ray.cluster import partitions

        if not result.committed:
            return None  # a dry run (validate_only) commits nothing
        uri, generation = str(result.output_uri), str(result.generation)
        options = self._storage_options(uri)
        try:
            committed = partitions.pinned(uri, generation, options)
            for output in result.outputs or committed.outputs:
                partitions.dataset_files(committed, output, options)
        except storage.StorageError as e:
            return f"the generation {generation} it committed is gone or incomplete ({e})"
        return None
