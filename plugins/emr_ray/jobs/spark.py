"""Job: start Spark on Ray (RayDP), read one committed input partition, run a preprocessing function,
write its outputs as a new generation of the output partition and commit it in one atomic step
(:mod:`emr_ray.partitions`). Spark is always stopped; an uncommitted generation is removed.

The preprocessing function (``spec.preprocess``, an import path) takes the input DataFrame and
the step's config and returns a DataFrame or a dict of named DataFrames (e.g. train and test).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from emr_ray import partitions, storage
from emr_ray.jobs import _usage
from emr_ray.jobs._runtime import JobInputError, main
from emr_ray.jobs.validation import schema_problems, value_problems
from emr_ray.spec import SparkJobSpec, import_by_path

log = logging.getLogger("emr_ray.jobs.spark")

# JDK 17 closes these packages; Spark's executors (and Arrow) need them open (see RayDP's docs).
_ADD_OPENS = [
    "java.lang", "java.lang.invoke", "java.io", "java.net", "java.nio", "java.math", "java.text",
    "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "sun.nio.ch", "sun.nio.cs",
    "sun.security.action", "sun.util.calendar",
]  # fmt: skip
JAVA_OPTIONS = " ".join(
    ["-XX:+IgnoreUnrecognizedVMOptions"] + [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in _ADD_OPENS]
)


def spark_configs(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Spark settings every RayDP session here needs, under the step's own."""
    configs = {
        "spark.executor.extraJavaOptions": JAVA_OPTIONS,
        "spark.driver.extraJavaOptions": JAVA_OPTIONS,
        "spark.ray.raydp_app_master.extraJavaOptions": JAVA_OPTIONS,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # RayDP's Arrow->Spark UDF calls ray.init() in Spark's Python workers; with log_to_driver on,
        # that process re-prints the cluster's logs into its own captured output: a log feedback loop.
        "spark.executorEnv.RAY_LOG_TO_DRIVER": "0",
    }
    configs.update(extra or {})
    return configs


def input_files(uri: str, options: storage.StorageOptions) -> list[str]:
    """The Parquet files of a committed input partition; checked before Spark starts (fail fast)."""
    if not storage.is_committed(uri, options):
        raise JobInputError(
            f"Input partition {uri} is missing or not committed (no {storage.SUCCESS_MARKER}); "
            "check the partition date and that the producer finished, then rerun."
        )
    files = storage.list_parquet_files(uri, options)
    if not files:
        raise JobInputError(
            f"Input partition {uri} has no Parquet files; the producer wrote an empty partition."
        )
    return files


def read_partition(spark, uri: str, files: list[str], options: storage.StorageOptions):
    """A committed input partition as a Spark DataFrame: exactly the validated ``files``.

    COS is read by the Spark executors themselves with pyarrow (Spark here has no S3A): one Spark
    task per file, Arrow batches straight into Spark (``mapInArrow``). No Ray task is involved, so
    the job needs no CPU beyond what its executors hold: two jobs whose executors fill the cluster
    both run (Ray tasks, which ask for a CPU, waited forever there). ``file://`` and ``hdfs://`` go
    through Spark's own Hadoop client (see :func:`emr_ray.storage.spark_hadoop_configs`).
    """
    scheme, _ = storage.split_uri(uri)
    if scheme != "cos":
        return spark.read.parquet(*[storage.qualify(uri, f) for f in files])
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    fsys = storage.filesystem(uri, options)
    schema = from_arrow_schema(pq.read_schema(files[0], filesystem=fsys))  # every file was validated

    def read(batches):
        import pyarrow.parquet as pq

        for batch in batches:
            for path in batch.column("path").to_pylist():
                yield from pq.read_table(path, filesystem=fsys).to_batches()

    paths = spark.createDataFrame([(f,) for f in files], "path string").repartition(len(files))
    return paths.mapInArrow(read, schema)


def write_output(df, uri: str, options: storage.StorageOptions) -> None:
    """Write ``df`` as Parquet under ``uri`` (a staging prefix; the caller commits it).

    To COS, each Spark task writes its partition as ``part-<partition>.parquet`` with pyarrow: a
    retried task overwrites its own file, so a retry never adds rows. An empty DataFrame still
    leaves one (empty) file with its schema.
    """
    scheme, path = storage.split_uri(uri)
    if scheme != "cos":
        df.write.mode("overwrite").parquet(storage.qualify(uri, path))
        return
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    fsys = storage.filesystem(uri, options)
    arrow_schema = to_arrow_schema(df.schema)

    def write(batches):
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        name = f"{path}/part-{TaskContext.get().partitionId():05d}.parquet"
        writer = None
        for batch in batches:
            if batch.num_rows:
                writer = writer or pq.ParquetWriter(name, batch.schema, filesystem=fsys)
                writer.write_batch(batch)
        if writer is not None:
            writer.close()
            yield pa.RecordBatch.from_pylist([{"file": name}])

    if not df.mapInArrow(write, "file string").collect():
        pq.write_table(arrow_schema.empty_table(), f"{path}/part-00000.parquet", filesystem=fsys)


def validate_columns(df, required: list[str], uri: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise JobInputError(
            f"Input partition {uri} lacks column(s) {missing}; it has {df.columns}. "
            "Fix the producer or the step's feature_columns/label_column."
        )


def run(spec: SparkJobSpec) -> dict[str, Any]:
    import ray
    import raydp

    options = spec.storage.options()
    partition = spec.partition
    input_uri = spec.input_uri
    output_uri = spec.output_uri
    preprocess = import_by_path(spec.preprocess)
    config = spec.config
    spark_spec = spec.spark

    files = input_files(input_uri, options)
    _raise_if(schema_problems(files, config.get("schema", {}), input_uri, options), input_uri)
    _usage.lap("check_input")
    if spec.validate_only:
        rows_in = storage.count_parquet_rows(files, input_uri, options)
        log.info("Validated %s (dry run: committed, schema, %d rows); nothing written", input_uri, rows_in)
        return {"partition": partition, "input_uri": input_uri, "rows_in": rows_in, "validated": True}
    ray.init(address="auto", logging_level=logging.WARNING, ignore_reinit_error=True)
    _usage.lap("ray_connect")
    hadoop = storage.spark_hadoop_configs([input_uri, output_uri], options)
    if hadoop:
        log.info("hdfs:// goes to WebHDFS at %s (ViewFileSystemOverloadScheme)",
                 storage.webhdfs_address(input_uri if input_uri.startswith("hdfs:") else output_uri, options))  # fmt: skip
    if options.hdfs_user:
        os.environ.setdefault("HADOOP_USER_NAME", options.hdfs_user)  # read by the JVM raydp starts next
        hadoop["spark.executorEnv.HADOOP_USER_NAME"] = options.hdfs_user
    started = time.monotonic()
    spark = raydp.init_spark(
        app_name=spark_spec.app_name,
        num_executors=spark_spec.num_executors,
        executor_cores=spark_spec.executor_cores,
        executor_memory=spark_spec.executor_memory,
        placement_group_strategy=spark_spec.placement_group_strategy,
        configs=spark_configs({**hadoop, **spark_spec.configs}),
    )
    _usage.lap("spark_start")
    log.info("Spark on Ray started in %.1fs: %s executor(s) x %s core(s), %s each", time.monotonic() - started,
             spark_spec.num_executors, spark_spec.executor_cores, spark_spec.executor_memory)  # fmt: skip
    generation = partitions.new_generation()
    committed = None
    try:
        df = read_partition(spark, input_uri, files, options).cache()
        validate_columns(df, config.get("required_columns", []), input_uri)
        _raise_if(value_problems(df, config.get("finite_columns", [])), input_uri)
        rows_in = df.count()
        log.info("Read %d rows from %s", rows_in, input_uri)
        _usage.lap("read")
        if rows_in == 0:
            raise JobInputError(f"Input partition {input_uri} has 0 rows; nothing to preprocess.")
        outputs = preprocess(df, config)
        if not isinstance(outputs, dict):
            outputs = {"data": outputs}
        written: dict[str, Any] = {}
        for name, out in outputs.items():
            out = out.cache()
            rows = out.count()
            _usage.lap("compute")
            write_output(out, partitions.output_uri(output_uri, generation, name), options)
            _usage.lap("write")
            written[name] = {"rows": rows,
                             "schema": [[f.name, f.dataType.simpleString()] for f in out.schema.fields]}  # fmt: skip
            log.info("Wrote output %r: %d rows", name, rows)
        manifest = {
            "partition": partition,
            "input_uri": input_uri,
            "input_files": input_file_sizes(files, input_uri, options),
            "rows_in": rows_in,
            "outputs": written,
            "producer": spec.identity,
            "preprocess": spec.preprocess,
        }
        committed = partitions.commit(output_uri, generation, manifest, options, keep=spec.keep_generations)
        _usage.lap("commit")
    finally:
        raydp.stop_spark()
        _usage.lap("spark_stop")
        if committed is None:
            partitions.discard(output_uri, generation, options)
    return {
        "partition": partition,
        "input_uri": input_uri,
        "output_uri": output_uri,
        "generation": generation,
        "superseded_by": committed.superseded_by,
        "rows_in": rows_in,
        "rows_out": {name: item["rows"] for name, item in written.items()},
        "outputs": {name: committed.output_uri(name) for name in written},
    }


def input_file_sizes(files: list[str], uri: str, options: storage.StorageOptions) -> list[list[Any]]:
    """The input files with their sizes, recorded in the manifest: which raw data made this generation."""
    fsys = storage.filesystem(uri, options)
    return [[info.path, info.size] for info in fsys.get_file_info(files)]


def _raise_if(problems: list[str], uri: str) -> None:
    if problems:
        raise JobInputError(
            f"Input partition {uri} failed validation: "
            + "; ".join(problems)
            + ". Fix the producer (or the step's declared schema) and rerun; nothing was written."
        )


if __name__ == "__main__":
    main(run, spec_type=SparkJobSpec)
