"""Records in, the Retraining view's model out: pure functions, no I/O.

A run's tasks are recognised by what they returned, not by their ids, so every retraining DAG of
the provider (and yours) fits: a preprocessing result carries ``generation`` and ``rows_in``
(:class:`~emr_ray.operators.raydp.RayDPSparkOperator`), a training result ``mlflow_run_id`` and
``final_metrics`` (:class:`~emr_ray.operators.torch.TorchTrainOperator`), a registration
``model_name`` and ``promoted`` (:class:`~emr_ray.operators.mlflow.MLflowRegisterOperator`). Every
Ray job's result carries ``usage`` (:mod:`emr_ray.cluster.jobs._usage`): the cost columns.

Something missing (a run still going, a run from before ``usage`` existed, MLflow down) is a None
and a note on the row, never an exception: the page must show what is known.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from emr_ray.cluster.results import JobResult, PredictResult, SparkResult, TrainResult, Usage
from emr_ray.params import partition_of
from emr_ray.views.records import Registry, RunRecord, ScoringRecord, TaskRecord

#: Airflow's run types as the view names them
RUN_TYPES = {
    "scheduled": "scheduled",
    "manual": "manual",
    "backfill": "backfill",
    "asset_triggered": "asset",
    "asset_materialization": "asset",
    "operator_triggered": "triggered",
}
#: a registration's outcome: the champion moved to it, it became challenger only, it was not registered
PROMOTED, CHALLENGER, NOT_REGISTERED, NO_DECISION = "promoted", "challenger", "not registered", "none"
DECISIONS = (PROMOTED, CHALLENGER, NOT_REGISTERED, NO_DECISION)
STATES = ("success", "failed", "running", "queued")
PAGE_SIZE = 25
MAX_PAGE_SIZE = 500
#: extra link names (``emr_ray.links``) shown per row, in this order
LINK_NAMES = ("Ray Dashboard", "MLflow Run", "MLflow Model Version")


class FilterError(ValueError):
    """A filter the page cannot apply; the message says what is accepted."""


@dataclass(frozen=True)
class Filters:
    """Which rows to show: partitions from ``start`` to ``end`` (inclusive ISO dates), run states and
    decisions (empty: all)."""

    start: str | None = None
    end: str | None = None
    states: frozenset[str] = frozenset()
    decisions: frozenset[str] = frozenset()

    @classmethod
    def parse(
        cls,
        start: str | None = None,
        end: str | None = None,
        states: Iterable[str] = (),
        decisions: Iterable[str] = (),
    ) -> Filters:
        """Filters from a query string's values; an unknown value raises :class:`FilterError`."""
        for name, value in (("from", start), ("to", end)):
            if value:
                try:
                    dt.date.fromisoformat(value)
                except ValueError as e:
                    raise FilterError(f"{name}={value!r}: give a date as YYYY-MM-DD") from e
        chosen_states = frozenset(s for s in states if s)
        chosen_decisions = frozenset(d for d in decisions if d)
        if unknown := sorted(chosen_decisions - set(DECISIONS)):
            raise FilterError(f"decision {unknown}: choose from {list(DECISIONS)}")
        return cls(start or None, end or None, chosen_states, chosen_decisions)

    def keeps(self, row: PartitionRow) -> bool:
        if self.start and (row.partition or "") < self.start:
            return False
        if self.end and (row.partition or "9999") > self.end:
            return False
        if self.states and row.state not in self.states:
            return False
        return not self.decisions or row.decision in self.decisions


@dataclass(frozen=True)
class Gate:
    """The promotion gate's figures: the metric, the new model's value and the champion's."""

    metric: str | None = None
    challenger: float | None = None
    champion: float | None = None
    champion_version: str | None = None
    same_rows: bool = False


@dataclass(frozen=True)
class Link:
    label: str
    url: str


@dataclass(frozen=True)
class Scored:
    """A batch scoring with a row's model version (a ``RayBatchPredictOperator`` task of any DAG)."""

    dag_id: str
    run_id: str
    state: str | None
    rows: int | None = None
    partition: str | None = None
    generation: str | None = None  # the predictions generation it committed
    link: Link | None = None  # its Ray job


@dataclass(frozen=True)
class PartitionRow:
    """One partition-run: what it read and wrote, what it trained and decided, what it cost."""

    run_id: str
    partition: str | None
    run_type: str
    state: str | None
    run_after: dt.datetime | None
    generation: str | None = None
    rows_in: int | None = None
    rows_out: int | None = None
    model_name: str | None = None
    version: str | None = None
    gate: Gate = Gate()
    decision: str = NO_DECISION
    reason: str | None = None
    cpu_seconds: float | None = None
    gpu_seconds: float | None = None
    cpu_by_task: Mapping[str, float] = field(default_factory=dict)
    task_seconds: Mapping[str, float | None] = field(default_factory=dict)
    links: tuple[Link, ...] = ()
    notes: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # what MLflow's aliases say of this version now (champion, challenger)
    progress: str | None = None  # a running training's epoch and latest metrics, as MLflow has them now
    scored: tuple[Scored, ...] = ()  # the batch scorings with this row's version, newest first


@dataclass(frozen=True)
class Serving:
    """Which version serves now (the champion alias) and why: the run whose decision promoted it."""

    model_name: str | None = None
    version: str | None = None
    source: str = "none"  # "mlflow": the alias as MLflow has it now; "runs": the last promotion recorded
    promoted_by: str | None = None  # run id
    partition: str | None = None
    reason: str | None = None
    url: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class RetrainingView:
    """A page of rows (newest first), the filtered rows oldest first (for the plots), where it serves."""

    dag_id: str
    rows: tuple[PartitionRow, ...]
    chronological: tuple[PartitionRow, ...]
    total: int
    page: int
    pages: int
    page_size: int
    filters: Filters
    serving: Serving
    task_order: tuple[str, ...]


def task_kind(result: Any) -> str | None:
    """``"preprocess"``, ``"train"`` or ``"register"`` from what a task returned (its XCom, of any age)."""
    if not isinstance(result, Mapping):
        return None
    if "model_name" in result and "promoted" in result:
        return "register"
    if TrainResult.read(result) is not None:
        return "train"
    if (preprocessed := SparkResult.read(result)) is not None and preprocessed.committed:
        return "preprocess"
    return None


def run_partition(run: RunRecord, preprocess: SparkResult | None) -> str | None:
    """The partition a run processed: what its preprocessing says, else as
    :func:`emr_ray.params.run_partition` renders it (the ``partition`` param, the logical date, the
    day before a manual run without one)."""
    if preprocess and preprocess.partition:
        return preprocess.partition
    return partition_of(run.conf.get("partition"), run.logical_date, run.run_after)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def gate_of(register: Mapping[str, Any]) -> Gate:
    """The figures the decision compared: both models on the same test rows when the training scored
    the champion there (``comparison``), else the run's value against the champion's own."""
    comparison = register.get("comparison") or {}
    same_rows = bool(register.get("same_rows")) and bool(comparison)
    return Gate(
        metric=register.get("metric"),
        challenger=_number(comparison.get("challenger_value") if same_rows else register.get("value")),
        champion=_number(
            comparison.get("champion_value") if same_rows else register.get("champion_value_before")
        ),
        champion_version=_text(register.get("champion_version_before")),
        same_rows=same_rows,
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def decision_of(register: Mapping[str, Any] | None) -> str:
    if register is None:
        return NO_DECISION
    if register.get("promoted"):
        return PROMOTED
    return CHALLENGER if register.get("version") is not None else NOT_REGISTERED


def _usage(task: TaskRecord) -> Usage | None:
    job = JobResult.read(task.result)
    return job.usage if job else None


def partition_row(run: RunRecord) -> PartitionRow:
    """One run's row. A task of a known kind that finished without ``usage`` adds a note."""
    by_kind: dict[str, TaskRecord] = {}
    for task in run.tasks:
        kind = task_kind(task.result)
        if kind and kind not in by_kind:
            by_kind[kind] = task
    result = {kind: task.result for kind, task in by_kind.items()}
    preprocess, register = SparkResult.read(result.get("preprocess")), result.get("register")
    notes: list[str] = []
    cpu_by_task: dict[str, float] = {}
    gpu = 0.0
    for task in run.tasks:
        usage = _usage(task)
        if usage is None:
            if task_kind(task.result) in ("preprocess", "train"):
                notes.append(f"{task.task_id}: no usage recorded")
            continue
        cpu = _number(usage.cpu_seconds_reserved)
        if cpu is not None:
            cpu_by_task[task.task_id] = cpu
        gpu += _number(usage.gpu_seconds_reserved) or 0.0
    if register is None and run.state not in ("running", "queued"):
        notes.append("no registration result")
    rows_out = preprocess.rows_out if preprocess else None
    links = tuple(
        Link(name if name != "Ray Dashboard" else f"Ray job ({task.task_id})", url)
        for task in run.tasks
        for name in LINK_NAMES
        if (url := task.links.get(name))
    )
    return PartitionRow(
        run_id=run.run_id,
        partition=run_partition(run, preprocess),
        run_type=RUN_TYPES.get(run.run_type, run.run_type),
        state=run.state,
        run_after=run.run_after,
        generation=preprocess.generation if preprocess else None,
        rows_in=_int(preprocess.rows_in) if preprocess else None,
        rows_out=sum(rows_out.values()) if isinstance(rows_out, Mapping) and rows_out else None,
        model_name=_text((register or {}).get("model_name")),
        version=_text((register or {}).get("version")),
        gate=gate_of(register) if register else Gate(),
        decision=decision_of(register),
        reason=_text((register or {}).get("reason")),
        cpu_seconds=sum(cpu_by_task.values()) if cpu_by_task else None,
        gpu_seconds=gpu if cpu_by_task else None,
        cpu_by_task=cpu_by_task,
        task_seconds={task.task_id: task.seconds for task in run.tasks},
        links=links,
        notes=tuple(notes),
    )


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def newest_first(row: PartitionRow) -> tuple[str, float]:
    after = row.run_after.timestamp() if row.run_after else 0.0
    return (row.partition or "", after)


def with_aliases(row: PartitionRow, registry: Registry | None) -> PartitionRow:
    """``row`` with the aliases its version holds in MLflow now (none when MLflow did not answer), and
    its training's progress while it runs."""
    if registry is not None and registry.progress.get(row.run_id):
        row = dataclasses.replace(row, progress=registry.progress[row.run_id])
    if registry is None or registry.error or row.model_name is None or row.version is None:
        return row
    held = (registry.aliases.get(row.model_name) or {}).items()
    aliases = tuple(sorted(alias for alias, version in held if version == row.version))
    return dataclasses.replace(row, aliases=aliases) if aliases else row


def serving_of(rows: Sequence[PartitionRow], registry: Registry | None) -> Serving:
    """The champion now: MLflow's alias when MLflow answers, else the last promotion the runs recorded
    (with a note saying so). ``rows``: every row of the DAG, unfiltered, newest first."""
    promotions = [row for row in rows if row.decision == PROMOTED]
    model = next((row.model_name for row in rows if row.model_name), None)
    if model is None:
        return Serving(note="no run of this DAG has registered a model yet")
    if registry is not None and registry.error is None:
        version = (registry.aliases.get(model) or {}).get("champion")
        if version is None:
            return Serving(model_name=model, source="mlflow", note=f"{model} has no champion alias")
        why = next((row for row in promotions if row.version == version), None)
        return Serving(
            model_name=model,
            version=version,
            source="mlflow",
            promoted_by=why.run_id if why else None,
            partition=why.partition if why else None,
            reason=why.reason if why else None,
            url=registry.version_urls.get(f"{model}/{version}"),
            note=None if why else "promoted outside this DAG's recorded runs",
        )
    error = registry.error if registry is not None else "not asked"
    last = promotions[0] if promotions else None
    return Serving(
        model_name=model,
        version=last.version if last else None,
        source="runs",
        promoted_by=last.run_id if last else None,
        partition=last.partition if last else None,
        reason=last.reason if last else None,
        note=f"MLflow unavailable ({error}): the champion as this DAG's last promotion left it",
    )


def scorings_by_version(scorings: Iterable[ScoringRecord]) -> dict[tuple[str, str], tuple[Scored, ...]]:
    """Each model version's batch scorings, in the order given (newest first); a task whose result is
    not a scoring's (still running, or failed before it returned) names its version by nothing."""
    found: dict[tuple[str, str], list[Scored]] = {}
    for record in scorings:
        result = PredictResult.read(record.result)
        if result is None:
            continue
        url = record.links.get("Ray Dashboard")
        found.setdefault((result.model_name, str(result.model_version)), []).append(
            Scored(
                dag_id=record.dag_id,
                run_id=record.run_id,
                state=record.state,
                rows=result.rows,
                partition=result.partition,
                generation=result.generation,
                link=Link(f"Ray job ({record.dag_id})", url) if url else None,
            )
        )
    return {key: tuple(items) for key, items in found.items()}


def with_scorings(row: PartitionRow, scored: Mapping[tuple[str, str], tuple[Scored, ...]]) -> PartitionRow:
    """``row`` with the batch scorings of its model version."""
    if row.model_name is None or row.version is None:
        return row
    found = scored.get((row.model_name, str(row.version)), ())
    return dataclasses.replace(row, scored=found) if found else row


def build_view(
    dag_id: str,
    runs: Iterable[RunRecord],
    filters: Filters = Filters(),
    page: int = 1,
    page_size: int = PAGE_SIZE,
    registry: Registry | None = None,
    scorings: Iterable[ScoringRecord] = (),
) -> RetrainingView:
    """The view of ``dag_id``'s runs: filtered, newest partition first, page ``page`` (from 1) of
    ``page_size`` rows; the champion from ``registry`` (None or an error: from the runs); beside
    each version, the batch scorings that used it (``scorings``, of any DAG)."""
    if page < 1 or not 1 <= page_size <= MAX_PAGE_SIZE:
        raise FilterError(f"page must be >= 1 and page_size between 1 and {MAX_PAGE_SIZE}")
    run_list = list(runs)
    scored = scorings_by_version(scorings)
    every = sorted(
        (with_scorings(with_aliases(partition_row(run), registry), scored) for run in run_list),
        key=newest_first,
        reverse=True,
    )
    kept = [row for row in every if filters.keeps(row)]
    pages = max(1, math.ceil(len(kept) / page_size))
    start = (page - 1) * page_size
    order: dict[str, None] = {}
    for run in run_list:
        order.update(dict.fromkeys(task.task_id for task in run.tasks))
    return RetrainingView(
        dag_id=dag_id,
        rows=tuple(kept[start : start + page_size]),
        chronological=tuple(reversed(kept)),
        total=len(kept),
        page=page,
        pages=pages,
        page_size=page_size,
        filters=filters,
        serving=serving_of(every, registry),
        task_order=tuple(order),
    )
