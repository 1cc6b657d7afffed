"""Task contexts of the four kinds of DAG run, as Airflow builds them (the keys the operators read).

Airflow puts ``logical_date`` and ``ds`` in a context only when the run has a logical date: a manual
run triggered without one has neither, only its ``dag_run.run_after``. The unit layer has no Airflow
database for real task instances and DAG runs; the stand-ins carry the fields that are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pendulum
from airflow.sdk.api.datamodels._generated import DagRunType
from airflow.sdk.execution_time.context import MacrosAccessor

#: the generation the run's ``preprocess`` task committed (its XCom)
GENERATION = "g20261201T000000-0a1b2c3d"


@dataclass(frozen=True)
class DagRunFields:
    """Stands in for the context's ``dag_run``; its ``run_type`` is the task SDK's enum, as in a real task."""

    run_type: DagRunType
    logical_date: pendulum.DateTime | None
    run_after: pendulum.DateTime


class TaskInstanceFields:
    """Stands in for the context's ``ti``: its identity, and the XCom of this run's ``preprocess``."""

    def __init__(self, task_id: str) -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number = "d", "r1", task_id, -1, 1

    def xcom_pull(self, task_ids: str) -> dict[str, Any]:
        assert task_ids == "preprocess", task_ids
        return {"generation": GENERATION}


class UnsetVariables:
    """Stands in for the context's ``var.value``: every Variable is unset, so templates get their defaults."""

    def get(self, key: str, default: Any = None) -> Any:
        return default


@dataclass(frozen=True)
class RunKind:
    """A kind of DAG run, and the partition it processes (what ``PARTITION_TEMPLATE`` renders)."""

    name: str
    run_type: str
    logical_date: pendulum.DateTime | None
    run_after: pendulum.DateTime
    partition_param: str | None
    partition: str

    def context(self, task_id: str = "train", *, partition_param: bool = True) -> dict[str, Any]:
        """The context of ``task_id`` in such a run; ``partition_param=False``: the DAG has no such Param."""
        params = {"partition": self.partition_param} if partition_param else {}
        context: dict[str, Any] = {
            "ti": TaskInstanceFields(task_id),
            "dag_run": DagRunFields(DagRunType(self.run_type), self.logical_date, self.run_after),
            "params": params,
            "macros": MacrosAccessor(),
            "var": {"value": UnsetVariables()},
        }
        if self.logical_date is not None:
            context |= {"logical_date": self.logical_date, "ds": self.logical_date.strftime("%Y-%m-%d")}
        return context


AFTER = pendulum.datetime(2026, 12, 4, 10, 30, tz="UTC")
KINDS = [
    # the run made at midnight owns the day that just completed (params.daily_partitions)
    RunKind("scheduled", "scheduled", pendulum.datetime(2026, 12, 3, tz="UTC"),
            pendulum.datetime(2026, 12, 4, tz="UTC"), None, "2026-12-03"),
    RunKind("manual, a partition chosen", "manual", None, AFTER, "2026-12-01", "2026-12-01"),
    RunKind("manual, no logical date", "manual", None, AFTER, None, "2026-12-03"),
    RunKind("manual, a logical date", "manual", pendulum.datetime(2026, 11, 20, tz="UTC"), AFTER, None,
            "2026-11-20"),
    RunKind("backfill", "backfill", pendulum.datetime(2025, 3, 4, tz="UTC"), AFTER, None, "2025-03-04"),
]  # fmt: skip
