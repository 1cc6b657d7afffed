"""RayDPSparkOperator: a Spark preprocessing step on Ray (RayDP), run as a Ray job, committing one partition."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from emr_ray import storage
from emr_ray.identity import TaskIdentity
from emr_ray.operators.ray import RayJobOperator
from emr_ray.templating import as_bool


class RayDPSparkOperator(RayJobOperator):
    """Start Spark on Ray with ``raydp.init_spark``, preprocess one input partition, commit the output.

    The job reads ``<input_uri>/dt=<partition>`` (only if committed with ``_SUCCESS``), calls
    ``preprocess(df, config)`` (an import path to a function in ``include/``) and writes each returned
    DataFrame to ``<output_uri>/dt=<partition>/<name>/`` through a temporary prefix, committed with
    ``_manifest.json`` and ``_SUCCESS``; a rerun replaces the partition. Spark is always stopped.
    The XCom: partition, input and output URIs, rows in and rows out per output.

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
    :param validate_only: a quick dry run: check that the input partition is committed, matches the
        declared schema and count its rows from the Parquet footers; no Spark, nothing written
        (templated: ``"{{ params.dry_run }}"``).
    :param hdfs_conn_id: a ``webhdfs`` connection (the Apache HDFS provider's type) for ``hdfs://``
        URIs: host and port of the NameNode's WebHDFS endpoint, login = the HDFS user, extra
        ``use_ssl``; extra ``spark_over_webhdfs: true`` also sends Spark's ``hdfs://`` traffic to that
        endpoint (only for a WebHDFS-only endpoint such as the local stand-in, never on a real cluster).
        Without it, ``hdfs://`` URIs use the NameNode's host on port 9870. Nothing secret is read.
    """

    template_fields: Sequence[str] = (
        *RayJobOperator.template_fields, "preprocess", "input_uri", "output_uri", "partition", "config",
        "app_name", "num_executors", "executor_cores", "executor_memory", "spark_configs", "placement_group_strategy", "validate_only",
    )  # fmt: skip
    template_fields_renderers = {
        **RayJobOperator.template_fields_renderers,
        "config": "json",
        "spark_configs": "json",
    }
    job_module = "emr_ray.jobs.spark"
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
        hdfs_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
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
        self.hdfs_conn_id = hdfs_conn_id

    def build_spec(self, context: Any, identity: TaskIdentity) -> dict[str, Any]:
        partition = storage.validate_partition(str(self.partition))
        for uri in (self.input_uri, self.output_uri):
            storage.split_uri(uri)  # rejects bad schemes before any cluster work
        if int(self.num_executors) < 1 or int(self.executor_cores) < 1:
            raise ValueError("num_executors and executor_cores must be at least 1.")
        spec: dict[str, Any] = {}
        if any(storage.split_uri(uri)[0] == "hdfs" for uri in (self.input_uri, self.output_uri)):
            spec["storage"] = {"hdfs": self._hdfs_settings()}
        return spec | {
            "partition": partition,
            "preprocess": self.preprocess,
            "input_uri": storage.join(self.input_uri, f"dt={partition}"),
            "output_uri": storage.join(self.output_uri, f"dt={partition}"),
            "config": self.config,
            "validate_only": as_bool(self.validate_only),
            "spark": {
                "app_name": self.app_name or f"{identity.dag_id}-{identity.task_id}",
                "num_executors": int(self.num_executors),
                "executor_cores": int(self.executor_cores),
                "executor_memory": str(self.executor_memory),
                "configs": {k: str(v) for k, v in self.spark_configs.items()},
                "placement_group_strategy": self.placement_group_strategy,
            },
        }

    def _hdfs_settings(self) -> dict[str, Any]:
        """The ``webhdfs`` connection as the spec's ``storage.hdfs`` section (no secrets in it)."""
        if not self.hdfs_conn_id:
            return storage.StorageOptions().hdfs_public()
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(self.hdfs_conn_id)
        if conn.conn_type != "webhdfs":
            raise ValueError(
                f"Connection {self.hdfs_conn_id!r} has type {conn.conn_type!r}; hdfs_conn_id needs a "
                "'webhdfs' connection (host and port of the NameNode's WebHDFS endpoint, login = user)."
            )
        if not conn.host:
            raise ValueError(f"Connection {self.hdfs_conn_id!r} has no host; set the NameNode's host name.")
        extra = conn.extra_dejson
        https = str(extra.get("use_ssl", False)).lower() == "true"
        host = conn.host.split(",")[0].strip()  # the provider's hook takes a list of NameNodes
        port = conn.port or (9871 if https else storage.DEFAULT_WEBHDFS_PORT)
        return storage.StorageOptions(
            webhdfs_address=f"{'https' if https else 'http'}://{host}:{port}",
            hdfs_user=conn.login or None,
            hdfs_over_webhdfs=str(extra.get("spark_over_webhdfs", False)).lower() == "true",
        ).hdfs_public()
