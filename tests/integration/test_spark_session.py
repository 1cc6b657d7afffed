"""A warm Spark session that outlives one job (``spark_session="shared"``, :mod:`emr_ray.cluster.jobs.spark_session`).

Real Ray jobs on the session's cluster (its 2-CPU head, plus any node another test added), real
Spark on Ray, the COS stand-in with signature checks. Each test gives its sessions a configuration of
its own (a Spark setting with a fresh value), so no other test's session serves it. This module is
also a job (``python -m tests.integration.test_spark_session``) that kills the shared sessions, as
an operator of the cluster would; the test sees the live ones in the cluster's state API. The reuse rule for a raw partition landed again (issue 31,
item 5) is proved here too: its cleared preprocessing runs on a warm session, the cheapest real Spark.
That each call of a warm context starts from a clean state is checked on a local Spark session.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devstack.constants import BUCKET, REGION
from emr_ray.cluster import partitions, storage
from emr_ray.cluster.jobs._runtime import main
from emr_ray.exceptions import RayJobFailedError
from emr_ray.hooks.ray import RayHook
from include.data.synthetic import FEATURE_COLUMNS, make_partition
from tests.fixtures.ray import live_actors
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration
SCHEMA = {**dict.fromkeys(FEATURE_COLUMNS, "double"), "label": "int64"}
ROWS = 400


def no_room_job(spec: dict[str, Any]) -> dict[str, Any]:
    """The job: a shared session whose executor asks for more CPUs than the cluster has free, ever
    (so no idle pool of another test stopping meanwhile can make room); what its start said, and the
    sessions left live."""
    import ray

    from emr_ray.cluster.jobs import spark_session
    from emr_ray.cluster.jobs.spark_steps import spark_configs
    from emr_ray.cluster.spec import SparkSettings
    from emr_ray.cluster.warm.policy import DEFAULT

    ray.init(address="auto", logging_level=logging.WARNING)
    cores = int(ray.cluster_resources().get("CPU", 0)) + 1
    name = f"{spark_session.NAME_PREFIX}-no-room-{uuid.uuid4().hex[:6]}"
    settings = SparkSettings(app_name=name, executor_cores=cores, session="shared")
    actor = (
        spark_session.WarmSpark.actor_class()
        .options(name=name, namespace=spark_session.NAMESPACE, lifetime="detached")
        .remote(name, settings, spark_configs(), {}, float(spec["wait_s"]), policy=DEFAULT.idle_after(30))
    )
    try:
        ray.get(actor.acquire.remote(0.0))
        error = ""
    except ray.exceptions.RayActorError as e:
        error = str(e)
    return {"error": error[-3000:], "name": name, "sessions": spark_session.sessions()}


def kill_sessions_job(spec: dict[str, Any]) -> dict[str, Any]:
    """The job: kill every shared session, as an operator's ``ray kill`` would; their names."""
    import ray

    from emr_ray.cluster.jobs import spark_session

    ray.init(address="auto", logging_level=logging.WARNING)
    names = spark_session.sessions()
    for name in names:
        ray.kill(ray.get_actor(name, namespace=spark_session.NAMESPACE), no_restart=True)
    return {"sessions": names}


def run_job(job: str, **spec: Any) -> dict[str, Any]:
    """``<job>_job`` of this module, run as a Ray job by the provider's operator."""
    from emr_ray.operators.ray import RayJobOperator

    op = RayJobOperator(
        task_id=job, job_module="tests.integration.test_spark_session", spec={"job": job, **spec},
        poll_interval=0.5,
    )  # fmt: skip
    return op.execute({"ti": FakeTaskInstance(job)})


def kill_sessions() -> list[str]:
    return run_job("kill_sessions")["sessions"]


def shared_sessions() -> list[str]:
    """The live shared sessions, from the cluster's state API."""
    return live_actors(RayHook("ray_default"), "WarmSpark")


def cluster_cpus() -> int:
    """The cluster's CPUs (the session's head, plus any node another test added to it)."""
    return int(RayHook("ray_default").get_cluster_resources()["total"].get("CPU", 0))


def upload(hook, prefix: str, day: str, table: pa.Table | None = None) -> None:
    import io

    buffer = io.BytesIO()
    pq.write_table(table if table is not None else make_partition(day, ROWS), buffer)
    hook.upload_bytes(buffer.getvalue(), f"{prefix}raw/dt={day}/part-00000.parquet")
    hook.upload_bytes(b"", f"{prefix}raw/dt={day}/_SUCCESS")


def preprocess(
    prefix: str, day: str, session: str, tag: str, output: str = "staged", ti: FakeTaskInstance | None = None,
    **kwargs: Any,
) -> dict:  # fmt: skip
    from emr_ray.operators.raydp import RayDPSparkOperator

    op = RayDPSparkOperator(
        task_id="preprocess",
        preprocess="include.preprocessing.tabular:standardize",
        input_uri=f"cos://{BUCKET}/{prefix}raw",
        output_uri=f"cos://{BUCKET}/{prefix}{output}",
        partition=day,
        config={
            "feature_columns": FEATURE_COLUMNS,
            "label_column": "label",
            "schema": SCHEMA,
            "finite_columns": FEATURE_COLUMNS,
        },  # fmt: skip
        spark_configs={"spark.emr_ray.test_session": tag},  # this test's own session
        spark_session=session,
        poll_interval=0.5,
        pending_timeout=180,
        **kwargs,
    )
    op.execution_timeout = None
    return op.execute({"ti": ti or FakeTaskInstance("preprocess")})


def committed_rows(result: dict, endpoint: str, secret_id: str, secret_key: str) -> dict[str, list]:
    options = storage.StorageOptions(endpoint_override=endpoint, scheme="http", region=REGION,
                                     access_key=secret_id, secret_key=secret_key)  # fmt: skip
    fsys = storage.filesystem(result["output_uri"], options)
    committed = partitions.pinned(result["output_uri"], result["generation"], options)
    out = {}
    for name in result["outputs"]:
        uri = committed.output_uri(name)
        files = storage.list_parquet_files(uri, options)
        table = pa.concat_tables([pq.read_table(f, filesystem=fsys) for f in files])
        out[name] = sorted(table.to_pylist(), key=lambda row: tuple(sorted(row.items())))
    return out


def test_a_warm_session_serves_the_next_partition_with_its_own_credentials_and_writes_what_a_job_session_writes(
    ray_conn, cos_server, cos_conn, cos_prefix, monkeypatch
):
    from devstack.constants import SECRET_ID, SECRET_KEY
    from emr_ray.hooks.cos import COSHook
    from tests.fixtures.cos import cos_connection_json

    hook = COSHook(cos_conn)
    days = ["2026-10-01", "2026-10-02"]
    for day in days:
        upload(hook, cos_prefix, day)
    tag = uuid.uuid4().hex[:8]

    first = preprocess(cos_prefix, days[0], "shared", tag)
    assert first["spark_session"]["reused"] is False and first["spark_session"]["calls"] == 1

    # The next job runs with a rotated key of the same account (its SecretId, a new SecretKey; the old
    # one is refused from now on): the same warm session serves it (pools are keyed by what a connection
    # points at, its account included, never by its secret), reading and writing only with the keys this
    # job passes to it. Another account gets another pool (tests/unit/jobs/test_spark_session.py).
    before = cos_server.credentials.get(SECRET_ID)
    cos_server.register_credentials(SECRET_ID, "rotated-secret-key")
    monkeypatch.setenv(
        "AIRFLOW_CONN_COS_DEFAULT", cos_connection_json(cos_server.endpoint, password="rotated-secret-key")
    )
    try:
        second = preprocess(cos_prefix, days[1], "shared", tag)
    finally:
        if before is None:
            cos_server.credentials.pop(SECRET_ID, None)
        else:
            cos_server.credentials[SECRET_ID] = before
        monkeypatch.setenv("AIRFLOW_CONN_COS_DEFAULT", cos_connection_json(cos_server.endpoint))
    session, started = second["spark_session"], first["spark_session"]
    assert started["why"].startswith("no shared spark session was running") and not started["reused"]
    assert {k: session[k] for k in ("name", "start_seconds")} == {
        k: started[k] for k in ("name", "start_seconds")
    }
    assert session["calls"] == 2 and session["reused"] and session["why"] is None
    assert session["age_seconds"] > started["age_seconds"] and session["idle_seconds"] > 0
    usage = second["usage"]
    # the seconds the session sat idle between the two jobs are counted by the second one
    assert (
        usage["pool_idle"]["seconds"] == pytest.approx(session["idle_seconds"], abs=0.02)
        and usage["pool_idle"]["cpu_seconds"] > 0
    )
    assert "spark_start" not in usage["phases"] and "spark_session" in usage["phases"]  # no Spark start-up
    assert usage["held"]["actor:SharedSparkExecutors"]["cpu_seconds"] > 0  # the executor's share, this call

    # The second partition again, through a job's own session that needs every CPU of the cluster (one
    # executor per CPU) while the idle warm session holds one: the idle one gives way, and the job
    # writes the warm session's data, row for row.
    own = preprocess(cos_prefix, days[1], "job", tag, output="staged_by_job", num_executors=cluster_cpus())
    assert "spark_session" not in own and own["rows_out"] == second["rows_out"]
    assert sum(own["rows_out"].values()) == ROWS
    assert committed_rows(second, cos_server.endpoint, SECRET_ID, SECRET_KEY) == committed_rows(
        own, cos_server.endpoint, SECRET_ID, SECRET_KEY
    )
    assert session["name"] not in shared_sessions()


def test_bad_input_keeps_the_session_a_killed_one_is_replaced_two_jobs_at_once_both_finish_and_an_idle_one_stops(
    ray_conn, cos_server, cos_conn, cos_prefix
):
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from devstack.constants import SECRET_ID, SECRET_KEY
    from emr_ray.hooks.cos import COSHook

    hook = COSHook(cos_conn)
    upload(hook, cos_prefix, "2026-10-05")
    upload(hook, cos_prefix, "2026-10-07")
    bad = make_partition("2026-10-06", ROWS)
    values = bad["f03"].to_numpy().copy()
    values[[3, 9]] = np.nan
    values[40] = np.inf
    upload(
        hook,
        cos_prefix,
        "2026-10-06",
        bad.set_column(bad.schema.get_field_index("f03"), "f03", pa.array(values)),
    )
    tag = uuid.uuid4().hex[:8]

    first = preprocess(cos_prefix, "2026-10-05", "shared", tag, spark_idle_timeout=8)
    name = first["spark_session"]["name"]
    # bad values (NaN and infinity) are found by Spark inside the session: the input's fault, named,
    # no retry, nothing committed; the session stays
    with pytest.raises(
        RayJobFailedError, match=r"dt=2026-10-06 failed validation: column 'f03' has 3 NaN or infinite"
    ):
        preprocess(cos_prefix, "2026-10-06", "shared", tag, spark_idle_timeout=8)
    options = storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                     access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    assert partitions.current(f"cos://{BUCKET}/{cos_prefix}staged/dt=2026-10-06", options) is None
    again = preprocess(cos_prefix, "2026-10-05", "shared", tag, spark_idle_timeout=8)
    kept = ("name", "start_seconds")
    assert {k: again["spark_session"][k] for k in kept} == {k: first["spark_session"][k] for k in kept}
    assert again["spark_session"]["reused"] and again["spark_session"]["why"] is None
    assert again["spark_session"]["calls"] == 3

    # A session killed between jobs (its node lost, an operator's `ray kill`): the next job starts a fresh one.
    assert name in kill_sessions()
    fresh = preprocess(cos_prefix, "2026-10-05", "shared", tag, spark_idle_timeout=8)
    assert fresh["spark_session"]["name"] == name and fresh["spark_session"]["calls"] == 1
    assert sum(fresh["rows_out"].values()) == ROWS

    # Two jobs at once while it is idle: both finish, whole. The job it does not serve first waits
    # for it, at most as long as it took to start, before it may start another session (from its
    # own job: RayDP cannot start two sessions from one job, whose actors share its namespace).
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda day: preprocess(cos_prefix, day, "shared", tag, spark_idle_timeout=8),
                             ["2026-10-05", "2026-10-07"]))  # fmt: skip
    assert [sum(result["rows_out"].values()) for result in both] == [ROWS, ROWS]
    assert name in {result["spark_session"]["name"] for result in both}

    # Unused for its idle timeout, it stops by itself and frees its executor.
    deadline = time.monotonic() + 90
    while name in shared_sessions():
        assert time.monotonic() < deadline, "the idle shared session did not stop"
        time.sleep(1)


def test_a_cleared_preprocessing_recomputes_a_raw_partition_landed_again_and_a_retry_of_an_unchanged_one_reattaches(
    ray_conn, cos_server, cos_conn, cos_prefix, capsys
):
    """Issue 31, item 5: the producer lands a date's raw partition again under the same URI (other
    rows, a new ``_SUCCESS``) after it was preprocessed. The spec is the same, its data is not: the
    cleared task must run a new job and commit the new rows, not reattach to the old job and hand
    its generation downstream. A retry while the partition is unchanged still reattaches."""
    from devstack.constants import SECRET_ID, SECRET_KEY
    from emr_ray.hooks.cos import COSHook
    from emr_ray.identity import TaskIdentity

    hook, ray, day, tag = COSHook(cos_conn), RayHook(ray_conn), "2026-10-09", uuid.uuid4().hex[:8]
    upload(hook, cos_prefix, day)
    tries = [FakeTaskInstance("preprocess", try_number=1)]
    tries += [FakeTaskInstance("preprocess", try_number=n, run_id=tries[0].run_id) for n in (2, 3)]
    job_of = [TaskIdentity.from_context({"ti": ti}).submission_id() for ti in tries]

    def run(ti: FakeTaskInstance) -> dict:
        return preprocess(cos_prefix, day, "shared", tag, ti=ti, spark_idle_timeout=8)

    first = run(tries[0])
    assert first["rows_in"] == ROWS
    assert run(tries[1]) == first and ray.get_job(job_of[1]) is None  # unchanged: try 1's job, reused
    assert "same external inputs" in capsys.readouterr().out

    upload(hook, cos_prefix, day, make_partition(day, ROWS * 3 // 5))  # landed again: 240 rows
    cleared = run(tries[2])
    assert ray.get_job(job_of[2])["status"] == "SUCCEEDED"  # a new job ...
    assert cleared["rows_in"] == ROWS * 3 // 5 and cleared["generation"] != first["generation"]
    committed = committed_rows(cleared, cos_server.endpoint, SECRET_ID, SECRET_KEY)
    assert sum(len(rows) for rows in committed.values()) == ROWS * 3 // 5  # ... committed the new rows
    assert (
        f"Not reusing Ray job {job_of[0]} of try 1 (SUCCEEDED): the raw partition " in capsys.readouterr().out
    )


def test_a_session_none_of_whose_executors_can_be_placed_stops_and_says_why(ray_conn):
    """A warm session none of whose executors can be placed (found by a 30-partition backfill: a second
    session scaled out as the training group took the CPUs; its job waited 16 minutes; here, an
    executor larger than the cluster): its start fails, naming the cause, and it is gone, so the job
    waits for a live session instead of a session that can run nothing."""
    out = run_job("no_room", wait_s=3)
    assert "no Spark executor of this session could be placed on the cluster in 3s" in out["error"]
    assert "CPUs are held by other work" in out["error"]
    assert out["name"] not in out["sessions"] and out["name"] not in shared_sessions()


if __name__ == "__main__":
    main(lambda spec: globals()[f"{spec.get('job', 'kill_sessions')}_job"](spec))


def test_each_call_of_a_warm_session_starts_from_a_clean_state(spark):
    """Issue 32, item 2: one SparkSession served every call, so a job's time zone, temporary views and
    cached plans (their closures hold its credentials) reached the next job. Each call now gets its
    own session of the warm context, and what it cached is dropped when it ends."""
    from pyspark.sql import SparkSession

    from emr_ray.cluster.jobs.spark_session import call_session

    zone = spark.conf.get("spark.sql.session.timeZone")
    with call_session(spark) as first:
        first.conf.set("spark.sql.session.timeZone", "Pacific/Kiritimati")
        frame = first.createDataFrame([(1,), (2,)], "x int")
        frame.createOrReplaceTempView("left_behind")
        assert frame.cache().count() == 2
    with call_session(spark) as second:
        assert second.conf.get("spark.sql.session.timeZone") == zone
        assert not second.catalog.tableExists("left_behind")
        # user code asking for "the" session gets the call's, not the shared base (issue 53, item 5)
        assert SparkSession.getActiveSession()._jsparkSession.equals(second._jsparkSession)
        assert SparkSession.builder.getOrCreate()._jsparkSession.equals(second._jsparkSession)
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()
    assert SparkSession.getActiveSession()._jsparkSession.equals(spark._jsparkSession)  # the base again
