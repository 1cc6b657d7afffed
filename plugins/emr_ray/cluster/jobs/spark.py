"""Job: preprocess one committed input partition into a new generation of the output partition
(:mod:`.spark_steps`), in a Spark-on-Ray session of the job's own (started and always stopped here)
or, with ``spark_session="shared"``, in a warm session that outlives the job (:mod:`.spark_session`).

The preprocessing function (``spec.preprocess``, an import path) takes the input DataFrame and
the step's config and returns a DataFrame or a dict of named DataFrames (e.g. train and test).
"""

from __future__ import annotations

import dataclasses
import logging
import os

from emr_ray.cluster import storage
from emr_ray.cluster.jobs import _usage, spark_session
from emr_ray.cluster.jobs._runtime import main
from emr_ray.cluster.jobs.spark_steps import (  # noqa: F401 - JAVA_OPTIONS, spark_configs: this module's names too
    JAVA_OPTIONS,
    input_files,
    preprocess_partition,
    raise_if,
    session_settings,
    spark_configs,
    start_spark,
)
from emr_ray.cluster.jobs.validation import schema_problems
from emr_ray.cluster.results import SparkResult
from emr_ray.cluster.spec import SparkJobSpec
from emr_ray.cluster.warm import registry

log = logging.getLogger("emr_ray.cluster.jobs.spark")


def run(spec: SparkJobSpec) -> SparkResult:
    """Check the input, then preprocess it in a Spark session of this job's own, or in the warm shared
    one (``spec.spark.session``)."""
    import ray

    options = spec.storage.options()
    files = input_files(spec.input_uri, options)
    raise_if(schema_problems(files, spec.config.get("schema", {}), spec.input_uri, options), spec.input_uri)
    _usage.lap("check_input")
    if spec.validate_only:
        rows_in = storage.count_parquet_rows(files, spec.input_uri, options)
        log.info(
            "Validated %s (dry run: committed, schema, %d rows); nothing written", spec.input_uri, rows_in
        )
        return SparkResult(
            partition=spec.partition, input_uri=spec.input_uri, rows_in=rows_in, validated=True
        )
    ray.init(address="auto", logging_level=logging.WARNING, ignore_reinit_error=True)
    _usage.lap("ray_connect")
    configs, env = session_settings(spec, options)
    if spec.spark.session == "shared":
        return _run_shared(spec, configs, env, options, files)
    registry.release_idle(spark_session.cpus(spec.spark))  # idle warm pools give way to this job's executors
    os.environ.update(env)  # read by the JVM raydp starts next
    spark = start_spark(spec.spark.app_name, spec.spark, configs)
    _usage.lap("spark_start")
    try:
        return preprocess_partition(spark, spec, options, files, lap=_usage.lap)
    finally:
        import raydp

        raydp.stop_spark()
        _usage.lap("spark_stop")


def _run_shared(
    spec: SparkJobSpec,
    configs: dict[str, str],
    env: dict[str, str],
    options: storage.StorageOptions,
    files: list[str],
) -> SparkResult:
    import ray

    call = spark_session.run_shared(
        spec, configs, env, options, files, job_runtime_env=ray.get_runtime_context().runtime_env
    )
    call.report()
    # the call's own steps (read, compute, write, commit) under their names; the rest of the call
    # (reaching the session, and starting it when there was none) as ``spark_session``
    _usage.lap("spark_session", **call.phases)
    _usage.borrow_call("SharedSparkExecutors", call)
    return dataclasses.replace(call.value, spark_session=call.use)


if __name__ == "__main__":
    main(run, spec_type=SparkJobSpec, fast_exit=True)
