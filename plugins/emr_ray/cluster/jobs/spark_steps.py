"""The steps of a preprocessing job that run in a Spark session, a job's own (:mod:`.spark`) or a warm
one that outlives it (:mod:`.spark_session`): start Spark on Ray (RayDP), read one committed input
partition, run the preprocessing function, write its outputs as a new generation of the output
partition and commit it in one atomic step (:mod:`emr_ray.cluster.partitions`); an uncommitted
generation is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from emr_ray.cluster import file_records, partitions, retention, storage
from emr_ray.cluster.jobs._runtime import JobInputError
from emr_ray.cluster.jobs.validation import count_and_check
from emr_ray.cluster.results import SparkResult
from emr_ray.cluster.spec import SparkJobSpec, SparkSettings, import_by_path

log = logging.getLogger("emr_ray.cluster.jobs.spark")

# JDK 17 closes these packages; Spark's executors (and Arrow) need them open (see RayDP's docs).
_ADD_OPENS = [
    "java.lang",
    "java.lang.invoke",
    "java.io",
    "java.net",
    "java.nio",
    "java.math",
    "java.text",
    "java.util",
    "java.util.concurrent",
    "java.util.concurrent.atomic",
    "sun.nio.ch",
    "sun.nio.cs",
    "sun.security.action",
    "sun.util.calendar",
]
JAVA_OPTIONS = " ".join(
    ["-XX:+IgnoreUnrecognizedVMOptions"] + [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in _ADD_OPENS]
)
#: the Spark driver's and RayDP's app master's JVMs compile with C1 only: they plan and coordinate
#: while the rows go through the executors, which keep the full JIT. C2 compiling the driver's
#: start-up code competes with the executors' for the CPUs: a session's start and first job take
#: about 3 s less (``bench/spark_start.py``)
CONTROL_JAVA_OPTIONS = f"{JAVA_OPTIONS} -XX:TieredStopAtLevel=1"


def spark_configs(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Spark settings every RayDP session here needs, under the step's own."""
    configs = {
        "spark.executor.extraJavaOptions": JAVA_OPTIONS,
        "spark.driver.extraJavaOptions": CONTROL_JAVA_OPTIONS,
        "spark.ray.raydp_app_master.extraJavaOptions": CONTROL_JAVA_OPTIONS,
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
    through Spark's own Hadoop client (see :func:`emr_ray.cluster.storage.spark_hadoop_configs`).
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
            for index in batch.column("id").to_pylist():
                yield from pq.read_table(files[index], filesystem=fsys).to_batches()

    # one Spark partition per file, by index: a range in as many slices as files needs no shuffle
    # (a DataFrame of the paths spread with repartition() was one more stage per read)
    return spark.range(0, len(files), 1, numPartitions=len(files)).mapInArrow(read, schema)


def write_output(df, uri: str, options: storage.StorageOptions) -> list[dict[str, Any]] | None:
    """Write ``df`` as Parquet under ``uri`` (a staging prefix; the caller commits it).

    To COS, each Spark task writes its partition as ``part-<partition>.parquet`` with pyarrow and
    returns its record (:class:`~emr_ray.cluster.file_records.RecordingFile`: size, rows, sha256 of
    the bytes as they went out), so the commit reads nothing back: those records are returned. A
    retried task overwrites its own file, so a retry never adds rows. An empty DataFrame still leaves
    one (empty) file with its schema. To ``file://`` and HDFS, Spark's own writer (its output
    committer) writes, nothing is recorded, and None is returned.
    """
    scheme, path = storage.split_uri(uri)
    if scheme != "cos":
        df.write.mode("overwrite").parquet(storage.qualify(uri, path))
        return None
    import pyarrow.parquet as pq
    from pyspark import cloudpickle
    from pyspark.sql.pandas.types import to_arrow_schema

    cloudpickle.register_pickle_by_value(file_records)  # the executors need not have emr_ray installed
    fsys = storage.filesystem(uri, options)
    arrow_schema = to_arrow_schema(df.schema)
    recording_file = file_records.RecordingFile

    def write(batches):
        import json

        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        name = f"part-{TaskContext.get().partitionId():05d}.parquet"
        sink = writer = None
        rows = 0
        for batch in batches:
            if batch.num_rows:
                if writer is None:
                    sink = recording_file(fsys, f"{path}/{name}")
                    writer = pq.ParquetWriter(sink, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
        if writer is not None and sink is not None:
            writer.close()
            sink.close()
            yield pa.RecordBatch.from_pylist([{"record": json.dumps(sink.record(name, rows))}])

    records = [json.loads(row["record"]) for row in df.mapInArrow(write, "record string").collect()]
    if not records:
        with file_records.RecordingFile(fsys, f"{path}/part-00000.parquet") as sink:
            pq.write_table(arrow_schema.empty_table(), sink)
        records = [sink.record("part-00000.parquet", 0)]
    return records


def written_rows(records: list[dict[str, Any]] | None, uri: str, options: storage.StorageOptions) -> int:
    """The rows an output's write wrote: what its writers recorded, else (Spark's own writer) the
    written files' Parquet footers. Not a Spark count: that would compute the output a second time."""
    if records is not None:
        return sum(int(record["rows"]) for record in records)
    return storage.count_parquet_rows(storage.list_parquet_files(uri, options), uri, options)


def validate_columns(df, required: list[str], uri: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise JobInputError(
            f"Input partition {uri} lacks column(s) {missing}; it has {df.columns}. "
            "Fix the producer or the step's feature_columns/label_column."
        )


def session_settings(
    spec: SparkJobSpec, options: storage.StorageOptions
) -> tuple[dict[str, str], dict[str, str]]:
    """The Spark settings of this job's session and the environment its JVM needs (no secrets: COS keys
    go to each call's Spark tasks, :func:`read_partition` and :func:`write_output`)."""
    hadoop = storage.spark_hadoop_configs([spec.input_uri, spec.output_uri], options)
    if hadoop:
        log.info(
            "hdfs:// goes to WebHDFS at %s (ViewFileSystemOverloadScheme)",
            storage.webhdfs_address(
                spec.input_uri if spec.input_uri.startswith("hdfs:") else spec.output_uri, options
            ),
        )
    env: dict[str, str] = {}
    if options.hdfs_user:
        env["HADOOP_USER_NAME"] = os.environ.get("HADOOP_USER_NAME", options.hdfs_user)
        hadoop["spark.executorEnv.HADOOP_USER_NAME"] = options.hdfs_user
    return spark_configs({**hadoop, **spec.spark.configs}), env


def start_spark(app_name: str, settings: SparkSettings, configs: dict[str, str]):  # noqa: ANN201 - SparkSession
    import raydp

    started = time.monotonic()
    spark = raydp.init_spark(
        app_name=app_name,
        num_executors=settings.num_executors,
        executor_cores=settings.executor_cores,
        executor_memory=settings.executor_memory,
        placement_group_strategy=settings.placement_group_strategy,
        configs=configs,
    )
    log.info(
        "Spark on Ray started in %.1fs: %s executor(s) x %s core(s), %s each",
        time.monotonic() - started,
        settings.num_executors,
        settings.executor_cores,
        settings.executor_memory,
    )
    return spark


#: how long a warm session's start waits for its first executor to be placed and registered
EXECUTORS_WAIT_S = 60.0


class NoRoomForExecutors(RuntimeError):
    """A Spark session started, but the cluster could not place any of its executors."""


def wait_for_executors(spark: Any, timeout_s: float = EXECUTORS_WAIT_S, poll_s: float = 0.2) -> int:
    """Wait until at least one executor of ``spark`` has registered; how many have.

    RayDP asks Ray for the executors once the session has started; when other work took the CPUs in
    between (a warm session scaling out while a training's worker group starts on a small cluster),
    none is placed and every Spark job of the session waits without end ("Initial job has not
    accepted any resources": 16 minutes in a backfill here, until the group idled out). Raises
    :class:`NoRoomForExecutors` after ``timeout_s``."""
    context = spark.sparkContext._jsc.sc()
    deadline = time.monotonic() + timeout_s
    while True:
        executors = int(context.getExecutorMemoryStatus().size()) - 1  # the driver is listed too
        if executors >= 1:
            return executors
        if time.monotonic() > deadline:
            raise NoRoomForExecutors(
                f"no Spark executor of this session could be placed on the cluster in {timeout_s:.0f}s: "
                "its CPUs are held by other work (a training's worker group, another session); the job "
                "waits for a live session instead, or add CPUs to the cluster"
            )
        time.sleep(poll_s)


def preprocess_partition(
    spark: Any,
    spec: SparkJobSpec,
    options: storage.StorageOptions,
    files: list[str],
    *,
    lap: Callable[[str], None],
) -> SparkResult:
    """Read the validated ``files`` in ``spark``, preprocess, write a new generation and commit it (an
    uncommitted one is removed). The same steps in a job's own session and in a shared one."""
    partition, input_uri, output_uri, config = spec.partition, spec.input_uri, spec.output_uri, spec.config
    preprocess = import_by_path(spec.preprocess)
    generation = partitions.new_generation()
    committed = None
    unknown = False  # the commit failed with its outcome unknown (partitions.CommitStateUnknown)
    cached: list[Any] = []  # a shared session serves the next partition: free its memory for that
    lease = contextlib.ExitStack()
    try:
        df = read_partition(spark, input_uri, files, options).cache()
        cached.append(df)
        validate_columns(df, config.get("required_columns", []), input_uri)
        rows_in, problems = count_and_check(df, config.get("finite_columns", []))
        raise_if(problems, input_uri)
        log.info("Read %d rows from %s", rows_in, input_uri)
        lap("read")
        if rows_in == 0:
            raise JobInputError(f"Input partition {input_uri} has 0 rows; nothing to preprocess.")
        outputs = preprocess(df, config)
        if not isinstance(outputs, dict):
            outputs = {"data": outputs}
        written: dict[str, Any] = {}
        # from its first file on, the lease tells housekeeping this writer is active, however long it writes
        lease.enter_context(partitions.writer_lease(output_uri, generation, options))
        for name, out in outputs.items():  # computed once, as it is written: no count, no cache
            uri = partitions.output_uri(output_uri, generation, name)
            records = write_output(out, uri, options)
            rows = written_rows(records, uri, options)
            lap("write")
            written[name] = {
                "rows": rows,
                "schema": [[f.name, f.dataType.simpleString()] for f in out.schema.fields],
            }
            if records is not None:  # what the writers recorded: the commit checks its listing against it
                written[name]["files"] = records
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
        try:
            committed = partitions.commit(output_uri, generation, manifest, options)
        except partitions.CommitStateUnknown:
            unknown = True  # perhaps current: its files stay
            raise
        retention.tidy(output_uri, options)  # abandoned writers' files only: the sweep asks the registry
        lap("commit")
    finally:
        lease.close()
        for frame in cached:
            try:
                frame.unpersist()
            except Exception as e:  # a broken session: the error that broke it is the one to report
                log.warning("Could not unpersist a cached DataFrame: %s", e)
        if committed is None and not unknown:
            partitions.discard(output_uri, generation, options)
    return SparkResult(
        partition=partition,
        input_uri=input_uri,
        output_uri=output_uri,
        generation=generation,
        superseded_by=committed.superseded_by,
        rows_in=rows_in,
        rows_out={name: item["rows"] for name, item in written.items()},
        outputs={name: committed.output_uri(name) for name in written},
    )


def input_file_sizes(files: list[str], uri: str, options: storage.StorageOptions) -> list[list[Any]]:
    """The input files with their sizes, recorded in the manifest: which raw data made this generation."""
    fsys = storage.filesystem(uri, options)
    return [[info.path, info.size] for info in fsys.get_file_info(files)]


def raise_if(problems: list[str], uri: str) -> None:
    if problems:
        raise JobInputError(
            f"Input partition {uri} failed validation: "
            + "; ".join(problems)
            + ". Fix the producer (or the step's declared schema) and rerun; nothing was written."
        )
