"""Unit-test fixtures: one local Spark session for the tests that run Spark code in this process."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="session")
def spark():
    """A local Spark session (one JVM for the whole unit run)."""
    from pyspark.sql import SparkSession

    from emr_ray.cluster.jobs.spark import JAVA_OPTIONS

    session = (
        SparkSession.builder.master("local[1]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", JAVA_OPTIONS)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()
    logging.getLogger("py4j").setLevel(
        logging.WARNING
    )  # its connections log on close, after pytest's capture
