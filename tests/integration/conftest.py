"""Integration tests run Airflow code against real local services: every one gets the migrated
metadata DB of the session (``airflow_db`` in ``tests/conftest.py``, migrated once). The tests that
run Spark code in this process share one local Spark session (``spark``): a JVM, so not in the
unit layer."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _airflow_db(airflow_db):
    """Apply the session's ``airflow_db`` to every test in this folder."""
    return airflow_db


@pytest.fixture(scope="session")
def spark():
    """A local Spark session, one JVM for the whole run."""
    from pyspark.sql import SparkSession

    from emr_ray.cluster.jobs.spark_steps import CONTROL_JAVA_OPTIONS

    session = (
        SparkSession.builder.master("local[1]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        # one JVM that only plans and runs tiny jobs: C2 compiling Spark's code would cost more CPU
        # than it saves (the driver's own setting on the cluster, spark_steps.py)
        .config("spark.driver.extraJavaOptions", CONTROL_JAVA_OPTIONS)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()
    logging.getLogger("py4j").setLevel(
        logging.WARNING
    )  # its connections log on close, after pytest's capture
