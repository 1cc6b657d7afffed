"""What a retraining run left behind, as plain data: the input of the view model.

:mod:`emr_ray.views.sources` fills these from Airflow's metadata (DagRun, TaskInstance, XCom) and
MLflow's registry; tests and the benchmark build them by hand. Nothing here is stored anywhere new:
every field is a copy of something Airflow or MLflow already holds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskRecord:
    """One task instance of a run: its state, wall time, returned XCom and stored extra links.

    :param result: the task's ``return_value`` XCom (the operators return dicts), None when absent.
    :param links: extra link name -> URL, as the task stored them (``_link_<class>`` XComs).
    """

    task_id: str
    state: str | None = None
    seconds: float | None = None
    result: Any = None
    links: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRecord:
    """One DAG run with its task instances (in the DAG's task order when known)."""

    dag_id: str
    run_id: str
    run_type: str
    state: str | None
    logical_date: dt.datetime | None = None
    run_after: dt.datetime | None = None
    conf: Mapping[str, Any] = field(default_factory=dict)
    tasks: tuple[TaskRecord, ...] = ()


@dataclass(frozen=True)
class ScoringRecord:
    """A batch scoring task of any DAG (``RayBatchPredictOperator``): where it ran, its state, its
    returned XCom (a :class:`~emr_ray.cluster.results.PredictResult`) and its stored extra links."""

    dag_id: str
    run_id: str
    task_id: str
    state: str | None = None
    result: Any = None
    links: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Registry:
    """What MLflow's registry says now: aliases per registered model (``{"champion": "7"}``), or why
    it could not be asked (``error``), so a page can say so instead of failing."""

    aliases: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    version_urls: Mapping[str, str] = field(default_factory=dict)  # "<model>/<version>" -> UI URL
    error: str | None = None
    #: run id -> a running training's progress as MLflow has it now ("epoch 2 of 5, test_loss 0.3124")
    progress: Mapping[str, str] = field(default_factory=dict)
