"""Records from where they already live: Airflow's metadata database and MLflow's registry.

Runs, task instances and XComs are read with Airflow's own models in three queries per DAG (the
API server's session); the champion alias through :class:`~emr_ray.hooks.mlflow.MLflowHook`, once
per model and without retries, in the view's own threads and within the page's budget
(:mod:`emr_ray.views.mlflow_reads`), so a slow or down MLflow costs the page a note, never a hang
and never one of the API server's threads.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from emr_ray.links.mlflow import MLflowModelVersionLink, MLflowRunLink
from emr_ray.links.ray import RayJobLink
from emr_ray.views.mlflow_reads import PAGE_BUDGET_S, READS, Reads
from emr_ray.views.records import Registry, RunRecord, ScoringRecord, TaskRecord

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

#: the most recent runs a page reads (a year of daily partitions, with room for reruns)
MAX_RUNS = 1000
#: the operators whose tasks score a model version (their tasks' results name the version)
SCORING_OPERATORS = ("RayBatchPredictOperator",)
#: the most recent scoring tasks a page reads, over every DAG the user may read
RETRAINING_TAG = "retraining"
#: the XCom key each extra link stores its URL under -> the link's name
LINK_KEYS = {link().xcom_key: link.name for link in (RayJobLink, MLflowRunLink, MLflowModelVersionLink)}


def read_runs(session: Session, dag_id: str, limit: int = MAX_RUNS) -> list[RunRecord]:
    """The ``limit`` latest runs of ``dag_id`` (by ``run_after``) with their tasks' states, wall
    times, returned XComs and stored links; tasks in the order they started."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel as X
    from sqlalchemy import or_, select

    runs = session.scalars(
        select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.run_after.desc()).limit(limit)
    ).all()
    if not runs:
        return []
    run_ids = [run.run_id for run in runs]
    tis = session.execute(
        select(TI.run_id, TI.task_id, TI.map_index, TI.state, TI.duration, TI.start_date)
        .where(TI.dag_id == dag_id, TI.run_id.in_(run_ids))
        .order_by(TI.start_date.is_(None), TI.start_date, TI.task_id, TI.map_index)
    ).all()
    xcoms = session.execute(
        select(X.run_id, X.task_id, X.map_index, X.key, X.value).where(
            X.dag_id == dag_id,
            X.run_id.in_(run_ids),
            or_(X.key == "return_value", X.key.in_(list(LINK_KEYS))),
        )
    ).all()
    values: dict[tuple[str, str, int], dict[str, Any]] = defaultdict(dict)
    for row in xcoms:
        values[(row.run_id, row.task_id, row.map_index)][row.key] = X.deserialize_value(row)
    tasks: dict[str, list[TaskRecord]] = defaultdict(list)
    for ti in tis:
        stored = values.get((ti.run_id, ti.task_id, ti.map_index), {})
        tasks[ti.run_id].append(
            TaskRecord(
                task_id=ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]",
                state=None if ti.state is None else str(ti.state),
                seconds=ti.duration,
                result=stored.get("return_value"),
                links={LINK_KEYS[k]: str(v) for k, v in stored.items() if k in LINK_KEYS and v},
            )
        )
    return [
        RunRecord(
            dag_id=dag_id,
            run_id=run.run_id,
            run_type=str(run.run_type),
            state=None if run.state is None else str(run.state),
            logical_date=run.logical_date,
            run_after=run.run_after,
            conf=run.conf or {},
            tasks=tuple(tasks.get(run.run_id, ())),
        )
        for run in runs
    ]


MAX_SCORINGS = 1000


def read_scorings(
    session: Session, readable: set[str] | None = None, limit: int = MAX_SCORINGS
) -> list[ScoringRecord]:
    """The ``limit`` latest batch scoring tasks of the DAGs in ``readable`` (every DAG when None), with
    their returned XComs and stored links: which runs scored which model version (two queries)."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel as X
    from sqlalchemy import or_, select

    query = select(TI.dag_id, TI.run_id, TI.task_id, TI.map_index, TI.state).where(
        TI.operator.in_(SCORING_OPERATORS)
    )
    if readable is not None:
        query = query.where(TI.dag_id.in_(sorted(readable)))
    tis = session.execute(query.order_by(TI.start_date.desc()).limit(limit)).all()
    if not tis:
        return []
    wanted = {(ti.dag_id, ti.run_id, ti.task_id, ti.map_index) for ti in tis}
    xcoms = session.execute(
        select(X.dag_id, X.run_id, X.task_id, X.map_index, X.key, X.value).where(
            X.dag_id.in_({ti.dag_id for ti in tis}),
            X.task_id.in_({ti.task_id for ti in tis}),
            X.run_id.in_({ti.run_id for ti in tis}),
            or_(X.key == "return_value", X.key.in_(list(LINK_KEYS))),
        )
    ).all()
    values: dict[tuple[str, str, str, int], dict[str, Any]] = defaultdict(dict)
    for row in xcoms:
        key = (row.dag_id, row.run_id, row.task_id, row.map_index)
        if key in wanted:
            values[key][row.key] = X.deserialize_value(row)
    return [
        ScoringRecord(
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            state=None if ti.state is None else str(ti.state),
            result=(stored := values.get((ti.dag_id, ti.run_id, ti.task_id, ti.map_index), {})).get(
                "return_value"
            ),
            links={LINK_KEYS[k]: str(v) for k, v in stored.items() if k in LINK_KEYS and v},
        )
        for ti in tis
    ]


def retraining_dag_ids(session: Session, readable: set[str] | None = None) -> list[str]:
    """The active DAGs tagged ``retraining``, sorted; only those in ``readable`` when given."""
    from airflow.models.dag import DagModel, DagTag
    from sqlalchemy import select

    query = (
        select(DagModel.dag_id)
        .join(DagTag, DagTag.dag_id == DagModel.dag_id)
        .where(DagTag.name == RETRAINING_TAG, DagModel.is_stale.is_(False))
        .order_by(DagModel.dag_id)
    )
    return [d for d in session.scalars(query).all() if readable is None or d in readable]


def read_registry(
    model_names: Iterable[str],
    mlflow_conn_id: str = "mlflow_default",
    deadline: float | None = None,
    reads: Reads = READS,
) -> Registry:
    """The aliases of each model as MLflow has them now (or as it said them in the last
    :data:`~emr_ray.views.mlflow_reads.CACHE_TTL_S` seconds), and each champion's UI URL; when MLflow
    fails or is not back by ``deadline``, a Registry that says why."""
    names = sorted(set(model_names))
    if not names:
        return Registry()
    try:
        from emr_ray.hooks.mlflow import MLflowHook

        hook = MLflowHook(mlflow_conn_id)
        where = hook.tracking_uri  # the cache key: another MLflow behind the same connection id is another
    except Exception as e:  # a page shows what MLflow could not say; it never fails for it
        return Registry(error=f"{type(e).__name__}: {str(e)[:200]}")
    deadline = deadline or reads.deadline()
    aliases: dict[str, dict[str, str]] = {}
    problems = []
    for name in names:
        fetch = functools.partial(hook.get_aliases_once, name)
        answer = reads.get(("aliases", mlflow_conn_id, where, name), fetch, deadline)
        if answer.ok:
            aliases[name] = answer.value
        else:
            problems.append(answer.error or f"no answer within {PAGE_BUDGET_S:g} s: MLflow is slow")
    urls = {
        f"{name}/{version}": url
        for name, found in aliases.items()
        for version in found.values()
        if (url := hook.model_version_url(name, version))
    }
    return Registry(aliases=aliases, version_urls=urls, error="; ".join(sorted(set(problems))) or None)


#: the task states of a training that is still going
ACTIVE = frozenset({"running", "deferred", "queued", "scheduled", "up_for_retry", "restarting"})


def read_progress(
    dag_id: str,
    runs: Iterable[RunRecord],
    mlflow_conn_id: str = "mlflow_default",
    deadline: float | None = None,
    reads: Reads = READS,
) -> dict[str, str]:
    """Each active run's training progress as MLflow has it now: its run is found by the name every
    try of the task gives it (:attr:`emr_ray.identity.TaskIdentity.run_name`), its epochs from the
    run's ``epochs`` param and the steps logged. Empty when nothing is active or MLflow does not answer
    by ``deadline`` (read in the view's own threads, as the aliases are)."""
    from emr_ray.identity import TaskIdentity

    wanted: dict[str, str] = {}  # MLflow run name -> Airflow run id
    for run in runs:
        for task in run.tasks:
            if run.state in ACTIVE and task.state in ACTIVE and task.result is None:
                base, _, index = task.task_id.partition("[")
                identity = TaskIdentity(dag_id, run.run_id, base, int(index.rstrip("]") or -1))
                wanted[identity.run_name] = run.run_id
    if not wanted:
        return {}
    key = ("progress", mlflow_conn_id, dag_id, tuple(sorted(wanted.items())))
    answer = reads.get(key, lambda: _progress(wanted, mlflow_conn_id), deadline or reads.deadline())
    return answer.value if answer.ok else {}


def _progress(wanted: Mapping[str, str], mlflow_conn_id: str) -> dict[str, str]:
    try:
        from emr_ray.hooks.mlflow import MLflowHook

        hook = MLflowHook(mlflow_conn_id)
        with hook.fail_fast(), hook.credentials():
            client = hook.client
            experiments = [e.experiment_id for e in client.search_experiments(max_results=1000)]
            progress: dict[str, str] = {}
            for name, run_id in wanted.items():  # a few at a time: the runs still going
                found = client.search_runs(
                    experiments,
                    filter_string=f"tags.`emr_ray.run_name` = '{name}'",
                    max_results=1,
                    order_by=["attributes.start_time DESC"],
                )
                if found:
                    latest = found[0]
                    steps = {m.step for m in client.get_metric_history(latest.info.run_id, "test_loss")}
                    progress[run_id] = progress_text(
                        len(steps), latest.data.params.get("epochs"), latest.data.metrics
                    )
            return progress
    except Exception:  # progress is a courtesy: the page never fails for it
        return {}


def progress_text(done: int, epochs: str | None, metrics: Mapping[str, float]) -> str:
    """``epoch 2 of 5: test_loss 0.3124, test_accuracy 0.9100`` (the latest of the loop's metrics)."""
    shown = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("test_loss", "test_accuracy") if k in metrics)
    return f"epoch {done} of {epochs or '?'}" + (f": {shown}" if shown else "")
