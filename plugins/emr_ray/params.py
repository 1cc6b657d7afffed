"""DAG building blocks for partitioned pipelines: which partition a run processes, and its Param."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

#: the environment variable that moves the first date the DAGs can process (their ``start_date``)
HISTORY_START_ENV = "EMR_RAY_HISTORY_START"
#: the default first date: far enough back for backfills over years of partitions
DEFAULT_HISTORY_START = "2020-01-01"


def history_start() -> Any:
    """The DAGs' ``start_date``: the first partition date they can process, run or backfill.

    Airflow runs no task for a logical date before ``start_date`` (a run of such a date is marked
    successful and does nothing), so this is set far back (``2020-01-01``) rather than to the day a
    DAG was written; set ``EMR_RAY_HISTORY_START=YYYY-MM-DD`` where the workers run to move it.
    Read from the environment, not an Airflow Variable, so parsing a DAG never queries the database.
    With ``catchup=False`` the scheduler still starts with the latest interval only.
    """
    import datetime as dt

    import pendulum

    value = os.environ.get(HISTORY_START_ENV) or DEFAULT_HISTORY_START
    try:
        day = dt.date.fromisoformat(value)
        return pendulum.datetime(day.year, day.month, day.day, tz="UTC")
    except ValueError as e:
        raise ValueError(f"{HISTORY_START_ENV}={value!r} is not a date like 2020-01-01.") from e


#: the environment variable that sets the seconds between a task's tries in the provider's DAGs
RETRY_DELAY_ENV = "EMR_RAY_RETRY_DELAY"
#: the default delay before a task's first retry, tripled before each next one (Airflow adds up to as
#: much again as jitter): 20-40 s, then 60-120 s. The first retry comes soon because the commonest
#: failure a retry mends costs nothing to retry: Airflow 3.3.2 fails a deferred task whose trigger
#: fired before the scheduler saw the deferring process exit (apache/airflow#67287, #72716; 3 of 60
#: deferrals in a 30-partition backfill), and the retry reattaches to the finished Ray job. The second
#: waits long enough for a restarted component (a Jobs API, a scheduler) to be back.
DEFAULT_RETRY_DELAY_S = 20
RETRY_BACKOFF = 3.0
#: the longest wait between two tries, however many retries a task is given
MAX_RETRY_DELAY_S = 600


def task_defaults(retries: int = 2) -> dict[str, Any]:
    """The DAGs' ``default_args``: ``retries`` tries more, 20-40 s after the failure and then 3x longer
    each time (:data:`DEFAULT_RETRY_DELAY_S`); ``EMR_RAY_RETRY_DELAY`` seconds apart, constant, where
    that is set.

    One copy for every DAG. Read from the environment when the DAG is parsed (never a database query);
    a test stack sets a few seconds so that a retry it provokes does not wait minutes.
    """
    import datetime as dt

    value = os.environ.get(RETRY_DELAY_ENV)
    if not value:
        return {
            "retries": retries,
            "retry_delay": dt.timedelta(seconds=DEFAULT_RETRY_DELAY_S),
            "retry_exponential_backoff": RETRY_BACKOFF,
            "max_retry_delay": dt.timedelta(seconds=MAX_RETRY_DELAY_S),
            "owner": "ml-platform",
        }
    try:
        delay = dt.timedelta(seconds=float(value))
    except ValueError as e:
        raise ValueError(f"{RETRY_DELAY_ENV}={value!r} is not a number of seconds like 20.") from e
    return {"retries": retries, "retry_delay": delay, "owner": "ml-platform"}


#: how many runs of one DAG may be active at once: a run waiting for its partition must not hold up
#: a manual run; what protects the cluster is the Ray pools below, not this
MAX_ACTIVE_RUNS = 8

#: the Airflow pool of tasks that run Spark on Ray (preprocessing), and the one of tasks that train
#: on Ray: one pool per kind of work, each sized from the "lanes" of the cluster (a Spark job and a
#: training side by side; README "Sizing the pools"), so a run's training never queues behind the
#: preprocessing of the runs after it, as it did when both kinds shared one pool
SPARK_POOL = "ray_spark"
TRAIN_POOL = "ray_train"
#: one slot: promotions of a model never interleave (each decides against the champion the last left)
PROMOTION_POOL = "mlflow_promotion"


def daily_partitions() -> Any:
    """The schedule of a daily retraining DAG: a run per *completed* day.

    Airflow 3's ``@daily`` is a trigger timetable: the run made at 2026-12-01 00:00 has logical date
    2026-12-01, the day that has just begun, whose partition cannot exist yet. A data-interval
    timetable gives that run the interval 2026-11-30 to 2026-12-01 and the logical date 2026-11-30
    (the interval's start): the day that is complete. Backfills over ``--from-date/--to-date``
    process exactly those dates, as before.
    """
    from airflow.sdk import CronDataIntervalTimetable

    return CronDataIntervalTimetable("0 0 * * *", timezone="UTC")


#: The partition a run processes: the ``partition`` param of a manual run; else the run's logical date
#: (scheduled and backfill runs: the start of the completed day, see :func:`daily_partitions`); else, for a
#: manual run without a logical date, the day before it ran. A DAG without a ``partition`` param renders
#: it too (an operator's default: ``RayBatchPredictOperator.partition``).
PARTITION_TEMPLATE = (
    "{{ params.get('partition') or (dag_run.logical_date or dag_run.run_after - macros.timedelta(days=1))"
    ".strftime('%Y-%m-%d') }}"
)


def partition_of(chosen: Any = None, logical_date: Any = None, run_after: Any = None) -> str | None:
    """The partition rule of :data:`PARTITION_TEMPLATE`, the one copy every reader uses (the task
    context, the Retraining view, the audit, the deadline alert): the ``partition`` a run was given;
    else its logical date; else the day before it ran. Dates as datetimes or ISO text (the REST
    API's); None when the run has none."""
    import datetime as dt

    if chosen:
        return str(chosen)[:10]
    if logical_date:
        return (
            logical_date.strftime("%Y-%m-%d") if isinstance(logical_date, dt.date) else str(logical_date)[:10]
        )
    if run_after:
        if not isinstance(run_after, dt.datetime):
            run_after = dt.datetime.fromisoformat(str(run_after).replace("Z", "+00:00"))
        return (run_after - dt.timedelta(days=1)).strftime("%Y-%m-%d")
    return None


def run_partition(context: Mapping[str, Any]) -> str | None:
    """The partition a run processes, from its task context (:func:`partition_of`).

    The default ``partition`` tag of both a training's MLflow run and its model version, so the two
    agree in every kind of run (a manual run without a logical date has no ``ds``). None when the
    context has no date at all (a bare context in a test).
    """
    dag_run = context.get("dag_run")
    logical = getattr(dag_run, "logical_date", None) or context.get("logical_date") or context.get("ds")
    return partition_of(
        (context.get("params") or {}).get("partition"), logical, getattr(dag_run, "run_after", None)
    )


def run_type(context: Mapping[str, Any]) -> str:
    """The run's type as its plain value (``backfill``, ``manual``, ``scheduled``, ...; "" without a run).

    A task's ``dag_run.run_type`` is the task SDK's ``DagRunType`` enum, whose ``str()`` is
    ``DagRunType.BACKFILL``, not ``backfill``: compared as text, a backfill never looked like one (the
    chaos soak found backfill runs replacing the champion).
    """
    value = getattr(context.get("dag_run"), "run_type", None)
    return str(getattr(value, "value", value) or "")


#: an ISO date, matched whole (no trailing newline, ASCII digits only)
PARTITION_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])(?![\s\S])"


def partition_param() -> Any:
    """The optional ``partition`` Param (a date) for the trigger form."""
    from airflow.sdk import Param

    return Param(
        None,
        type=["null", "string"],
        # whole-string match in both Python (the API server) and JavaScript (the form): `$` alone lets
        # Python accept a trailing newline, and \d accepts non-ASCII digits
        pattern=PARTITION_PATTERN,
        description="Partition date YYYY-MM-DD; empty means the run's logical date (or yesterday).",
    )


def committed_output(task_id: str, output: str) -> str:
    """A template for the URI of ``output`` in the generation task ``task_id`` committed in this run.

    Pass it to the training task's ``datasets`` so the run reads exactly its own preprocessing's data,
    never a generation another run committed meanwhile.
    """
    return f"{{{{ ti.xcom_pull(task_ids='{task_id}')['outputs']['{output}'] }}}}"


def committed_generation(task_id: str) -> str:
    """A template for the generation task ``task_id`` committed in this run (for model version tags)."""
    return f"{{{{ ti.xcom_pull(task_ids='{task_id}')['generation'] }}}}"


def pipeline_params() -> dict[str, Any]:
    """The Params every retraining DAG shares: which partition, and the two reliability switches."""
    from airflow.sdk import Param

    return {
        "partition": partition_param(),
        "force_recompute": Param(
            False,
            type="boolean",
            description="Recompute every step: reuse no earlier try's job and no stored training result.",
        ),
        "promote_historical": Param(
            False,
            type="boolean",
            description="Let a backfill, or a partition older than the champion's, replace the champion.",
        ),
    }


#: the Spark steps' session, from the run's ``spark_session`` Param
SPARK_SESSION_TEMPLATE = "{{ params.spark_session }}"
#: how long a shared Spark session waits for the next partition: the ``emr_ray_spark_idle_timeout``
#: Variable (seconds), 600 by default (a backfill's next partition comes within minutes)
SPARK_IDLE_TIMEOUT_TEMPLATE = "{{ var.value.get('emr_ray_spark_idle_timeout', 600) }}"


#: how long a Ray task watches its job before deferring: the ``emr_ray_defer_after`` Variable
#: (seconds), 30 by default. Watching saves a job that ends by then the triggerer's round trip and
#: the second task process, and holds a worker slot meanwhile: with warm pools, a 30-partition
#: backfill on 4 worker slots took 372 s watching against 459 s deferring at once, 6 task processes
#: a partition instead of 8, Airflow's CPU 1.28x less (bench/results/SUMMARY.md); 0 defers at once
DEFER_AFTER_TEMPLATE = "{{ var.value.get('emr_ray_defer_after', 30) }}"


#: where the training's loop runs, from the run's ``worker_group`` Param
WORKER_GROUP_TEMPLATE = "{{ params.worker_group }}"
#: how long a warm training worker group waits for the next partition: the
#: ``emr_ray_worker_group_idle_timeout`` Variable (seconds), 600 by default
WORKER_GROUP_IDLE_TIMEOUT_TEMPLATE = "{{ var.value.get('emr_ray_worker_group_idle_timeout', 600) }}"


def worker_group_param() -> Any:
    """Where the training runs: a warm ``shared`` worker group, or Ray Train's group for the ``job``."""
    from airflow.sdk import Param

    return Param(
        "shared",
        enum=["shared", "job"],
        description="shared: a warm worker group that outlives the job trains (no worker start-up per "
        "partition; released when the cluster needs its CPUs); job: Ray Train starts and stops a worker "
        "group for each training.",
    )


def spark_session_param() -> Any:
    """Which Spark session the preprocessing runs in: a warm ``shared`` one, or the ``job``'s own."""
    from airflow.sdk import Param

    return Param(
        "shared",
        enum=["shared", "job"],
        description="shared: a warm Spark-on-Ray session that outlives the job serves the preprocessing "
        "(no Spark start-up per partition; released when the cluster needs its CPUs); job: each "
        "preprocessing job starts and stops its own.",
    )


#: the Params of the runs ``retrain_on_arrival`` triggers, beside their partition: this Variable (a
#: JSON object of ``retrain_tabular``'s Params; none by default, so the DAG's defaults)
ARRIVAL_CONF_VARIABLE = "emr_ray_arrival_conf"


def arrival_conf(partition: str, variable: str | None) -> dict[str, Any]:
    """The conf of the run of one landed ``partition``: its partition, plus the Params the
    :data:`ARRIVAL_CONF_VARIABLE` Variable holds (``variable``, its text; None when unset). Raises
    ``ValueError`` naming the Variable and the fix when it is not a JSON object or names the partition."""
    import json

    if variable is None or not variable.strip():
        return {"partition": partition}
    fix = 'set it to a JSON object of retrain_tabular\'s Params (for example {"epochs": 1}) or delete it'
    try:
        params = json.loads(variable)
    except json.JSONDecodeError as e:
        raise ValueError(f"The {ARRIVAL_CONF_VARIABLE} Variable is not JSON ({e}): {fix}") from e
    if not isinstance(params, dict):
        raise ValueError(
            f"The {ARRIVAL_CONF_VARIABLE} Variable is a JSON {type(params).__name__}, not an object: {fix}"
        )
    if "partition" in params:
        raise ValueError(
            f"The {ARRIVAL_CONF_VARIABLE} Variable sets 'partition', which each run takes from the "
            "partition that landed: remove it"
        )
    return params | {"partition": partition}
