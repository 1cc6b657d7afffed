"""Unit-test fixtures: one local Spark session for the tests that run Spark code in this process.

In `make unit` its JVM starts in the background as collection ends (``tests/fixtures/early.py``), so
the seconds it takes to start and load Spark's classes overlap the tests before the first Spark test.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from tests.fixtures.early import wanted_early

_started: dict[str, Any] = {}


def _start_spark() -> None:
    from pyspark.sql import SparkSession

    from emr_ray.cluster.jobs.spark_steps import CONTROL_JAVA_OPTIONS

    try:
        session = (
            SparkSession.builder.master("local[1]")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            # one JVM that only plans and runs tiny jobs: C2 compiling Spark's code would cost more
            # CPU than it saves (the driver's own setting on the cluster, spark_steps.py)
            .config("spark.driver.extraJavaOptions", CONTROL_JAVA_OPTIONS)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        session.createDataFrame([(1, "a")], "n int, s string").groupBy("s").count().collect()
        _started["session"] = session
    except BaseException as error:  # handed to the first test that needs the session
        _started["error"] = error


def pytest_collection_finish(session: pytest.Session) -> None:
    if wanted_early(session, "spark"):
        _started["thread"] = threading.Thread(target=_start_spark, name="spark-start", daemon=True)
        _started["thread"].start()


@pytest.fixture(scope="session")
def spark():
    """A local Spark session (one JVM for the whole unit run)."""
    if "thread" not in _started:
        _start_spark()
    else:
        _started["thread"].join()
    if "error" in _started:
        raise _started["error"]
    session = _started["session"]
    yield session
    session.stop()
    logging.getLogger("py4j").setLevel(
        logging.WARNING
    )  # its connections log on close, after pytest's capture
