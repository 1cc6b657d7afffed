"""Deadline callbacks for DAGs (Airflow 3's ``DeadlineAlert``, which replaced Airflow 2's SLAs).

A retraining run that is not done in time usually means a late partition or a busy cluster; the
team wants a warning while the run goes on, not a failed run. Use as
``DAG(..., deadline=warn_after(timedelta(hours=3)))``.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

#: the import path Airflow's triggerer resolves the callback by
MISSED_DEADLINE_CALLBACK = "emr_ray.deadlines.warn_missed_deadline"
#: set to ``off`` to parse DAGs without deadlines (see :func:`warn_after`)
SWITCH_ENV = "EMR_RAY_DEADLINES"


def warn_after(interval: timedelta) -> Any:
    """A ``DeadlineAlert``: warn when a run is not done ``interval`` after it was queued.

    ``None`` when ``EMR_RAY_DEADLINES=off``: Airflow 3.3.2's ``airflow dags test`` crashes when a run
    of a DAG with a deadline succeeds (it looks the alerts up by database id, which a DAG it did not
    store has none of), so the embedded ``dags test`` runs (``make demo``, the tests) switch them off.
    """
    if os.environ.get(SWITCH_ENV, "on").lower() == "off":
        return None
    from airflow.sdk.definitions.callback import AsyncCallback
    from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=interval,
        callback=AsyncCallback(MISSED_DEADLINE_CALLBACK),
    )


def describe_miss(context: dict[str, Any]) -> str:
    """One line naming the run, when it was queued, its deadline and its state."""
    from emr_ray.params import partition_of

    run = context.get("dag_run") or {}
    deadline = (context.get("deadline") or {}).get("deadline_time")
    partition = partition_of(
        (run.get("conf") or {}).get("partition"), run.get("logical_date"), run.get("run_after")
    )
    return (
        f"Deadline missed: DAG {run.get('dag_id')!r} run {run.get('dag_run_id')!r} "
        f"(partition {partition or ''}, "
        f"queued at {run.get('queued_at')}) was not done by {deadline}; it is {run.get('state')}. "
        "Check the partition's arrival and the queues of the ray_spark and ray_train pools."
    )


async def warn_missed_deadline(context: dict[str, Any], **_: Any) -> str:
    """An ``AsyncCallback`` for ``DeadlineAlert``: log a warning in the triggerer; the run goes on."""
    message = describe_miss(context)
    log.warning("%s", message)
    return message
