"""DAG building blocks for partitioned pipelines: which partition a run processes, and its Param."""

from __future__ import annotations

from typing import Any

#: The partition a run processes: the ``partition`` param of a manual run; else the run's logical date
#: (scheduled and backfill runs); else, for a manual run without a logical date, the day before it ran.
PARTITION_TEMPLATE = (
    "{{ params.partition or (dag_run.logical_date or dag_run.run_after - macros.timedelta(days=1))"
    ".strftime('%Y-%m-%d') }}"
)


def partition_param() -> Any:
    """The optional ``partition`` Param (a date) for the trigger form."""
    from airflow.sdk import Param

    return Param(
        None,
        type=["null", "string"],
        pattern=r"^\d{4}-\d{2}-\d{2}$",
        description="Partition date YYYY-MM-DD; empty means the run's logical date (or yesterday).",
    )
