"""The audit's rules, as pure functions of what :mod:`emr_ray.audit.sources` read: no storage, MLflow, Ray
or Airflow here, so every rule is tested on tiny data (``tests/unit/test_audit_rules.py``).

Each rule returns :class:`Finding` s, each on one line of the table:

- ``lost``: something a finished run should have left is missing or short (a date without a current
  generation, fewer rows than the raw partition, a model version naming a generation or a run that
  does not exist, a kept version whose generation lost a file or rows, a run whose registration
  succeeded without a model version);
- ``duplicated``: something is there twice (more rows than the raw partition, two model versions of
  one Airflow run or one MLflow run);
- ``orphaned``: something runs or stays with nobody to own it (a Ray job RUNNING without a live
  Airflow try or beside a later try of its task, a warm pool alive long after the last job, a generation never committed whose
  writer is gone);
- ``misdecided``: the champion is not the version the promotion rule picks;
- ``leaked``: a secret in a log.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from emr_ray.cluster.promotion import Comparison, NonFiniteMetricError, decide, historical_reason
from emr_ray.params import partition_of

LINES = ("lost", "duplicated", "orphaned", "misdecided", "leaked")
#: task instance states in which a try is alive or about to run again (its Ray job is still owned)
LIVE_TI_STATES = frozenset(
    {"running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "restarting"}
)
#: Ray job states in which a job still holds the cluster
ACTIVE_JOB_STATES = frozenset({"PENDING", "RUNNING"})


@dataclass(frozen=True)
class Finding:
    """One thing wrong: the table line it counts on, the check that found it, and what it is."""

    line: str
    check: str
    what: str

    def __post_init__(self) -> None:
        if self.line not in LINES:
            raise ValueError(f"line={self.line!r}: use one of {', '.join(LINES)}")


# -- partitions -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionState:
    """What the store holds for one date.

    :param raw_rows: rows of the raw partition (its Parquet footers); None when it has none.
    :param current: the current generation's id, None when nothing is committed.
    :param rows_in: the rows the current generation's manifest says it read.
    :param declared: each output's rows, as the manifest declares them.
    :param found: each output's rows in the files the manifest lists (footers); None: a file is missing
        or has another size than the manifest says.
    :param uncommitted: each generation folder no commit names, with the seconds since anything in it
        (its writer's lease included) changed.
    """

    date: str
    raw_rows: int | None
    current: str | None
    rows_in: int | None = None
    declared: Mapping[str, int] = field(default_factory=dict)
    found: Mapping[str, int | None] = field(default_factory=dict)
    uncommitted: Mapping[str, float] = field(default_factory=dict)


def check_partition(p: PartitionState, *, idle_s: float) -> list[Finding]:
    """The date has exactly one current generation whose rows are the raw partition's, and no
    generation whose writer left it uncommitted for ``idle_s`` or more."""
    out: list[Finding] = []
    where = f"dt={p.date}"
    if p.raw_rows is not None and p.current is None:
        out.append(
            Finding(
                "lost", "partition", f"{where}: raw partition of {p.raw_rows} rows, no current generation"
            )
        )
    if p.current is not None:
        for name, rows in sorted(p.found.items()):
            if rows is None:
                out.append(
                    Finding(
                        "lost",
                        "partition",
                        f"{where} {p.current}: a file of output {name!r} is missing or changed",
                    )
                )
            elif rows != p.declared.get(name):
                line = "lost" if rows < p.declared.get(name, 0) else "duplicated"
                out.append(
                    Finding(
                        line,
                        "partition",
                        f"{where} {p.current}: output {name!r} holds {rows} rows, "
                        f"its manifest declares {p.declared.get(name)}",
                    )
                )
        total = sum(p.declared.values())
        for what, rows in (("read", p.rows_in), ("wrote", total)):
            if p.raw_rows is None or rows is None or rows == p.raw_rows:
                continue
            line = "lost" if rows < p.raw_rows else "duplicated"
            out.append(
                Finding(
                    line,
                    "partition",
                    f"{where} {p.current} {what} {rows} rows, the raw partition has {p.raw_rows}",
                )
            )
    for generation, idle in sorted(p.uncommitted.items()):
        if idle >= idle_s:
            out.append(
                Finding(
                    "orphaned",
                    "generation",
                    f"{where} {generation}: never committed, untouched for {idle:.0f} s",
                )
            )
    return out


# -- model versions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class VersionState:
    """One model version and what it names, as read from the registry and the store.

    :param generation_committed: the generation its ``data_uri``/``generation`` tags name is committed.
    :param run_found: its MLflow run exists.
    :param run_matches: that run's ``data_uri``/``generation``/``airflow.run_id`` tags are the version's.
    :param value: the gate metric its run logged (None: none).
    :param comparison: the champion comparison its run recorded (``promotion.comparison_from_run``).
    :param kept: the retention policy keeps its data (otherwise the data may have gone by design).
    :param data_problem: why its generation is not whole (a file missing or short, rows that differ
        from the manifest's), None when it is.
    """

    version: str
    mlflow_run_id: str | None
    airflow_run_id: str | None
    data_uri: str | None
    generation: str | None
    generation_committed: bool
    run_found: bool
    run_matches: bool
    value: float | None = None
    partition: str | None = None
    comparison: Comparison | None = None
    kept: bool = True
    data_problem: str | None = None

    @property
    def number(self) -> int:
        return int(self.version)


def check_versions(versions: Iterable[VersionState], registered_runs: Iterable[str]) -> list[Finding]:
    """Every version names an existing generation and the run that made it; one version per Airflow
    run (``registered_runs``: the runs whose registration task succeeded) and per MLflow run."""
    out: list[Finding] = []
    versions = sorted(versions, key=lambda v: v.number)
    for v in versions:
        name = f"v{v.version}"
        if not (v.data_uri and v.generation):
            out.append(Finding("lost", "model version", f"{name} has no data_uri/generation tags"))
        elif not v.kept:
            pass  # the retention policy let its data go: not a loss
        elif not v.generation_committed:
            out.append(
                Finding(
                    "lost",
                    "model version",
                    f"{name} names {v.generation} of {v.data_uri}, which is not committed",
                )
            )
        elif v.data_problem:
            out.append(
                Finding("lost", "model version", f"{name}'s generation {v.generation}: {v.data_problem}")
            )
        if not v.run_found:
            out.append(
                Finding("lost", "model version", f"{name}: its MLflow run {v.mlflow_run_id} does not exist")
            )
        elif not v.run_matches:
            out.append(
                Finding(
                    "lost",
                    "model version",
                    f"{name}: its MLflow run {v.mlflow_run_id} names other data or another Airflow run",
                )
            )
    for key, label in (
        (lambda v: v.airflow_run_id, "Airflow run"),
        (lambda v: v.mlflow_run_id, "MLflow run"),
    ):
        counts = Counter(key(v) for v in versions if key(v))
        for run, n in sorted(counts.items()):
            if n > 1:
                names = ", ".join(f"v{v.version}" for v in versions if key(v) == run)
                out.append(
                    Finding("duplicated", "model version", f"{label} {run} has {n} versions ({names})")
                )
    have = {v.airflow_run_id for v in versions}
    for run in sorted(set(registered_runs) - have):
        out.append(Finding("lost", "model version", f"Airflow run {run} registered, but no version names it"))
    return out


def run_type_of(airflow_run_id: str | None) -> str | None:
    """The run type Airflow's run ids start with (``backfill__``, ``manual__``, ``scheduled__``...)."""
    head, sep, _ = str(airflow_run_id or "").partition("__")
    return head if sep else None


def expected_champion(
    versions: Iterable[VersionState],
    *,
    direction: str = "max",
    min_improvement: float = 0.0,
    promote_historical: bool = False,
) -> str | None:
    """The version the promotion rule leaves as champion, replaying its decisions in registration
    order (the promotion pool runs one registration at a time, so version order is decision order)."""
    champion: VersionState | None = None
    for v in sorted(versions, key=lambda v: v.number):
        if v.value is None or not math.isfinite(v.value):
            continue
        try:
            decision = decide(
                v.value,
                champion_version=champion.version if champion else None,
                champion_value=champion.value if champion else None,
                direction=direction,
                min_improvement=min_improvement,
                comparison=v.comparison,
                historical=historical_reason(
                    run_type=run_type_of(v.airflow_run_id),
                    partition=v.partition,
                    champion_partition=champion.partition if champion else None,
                ),
                promote_historical=promote_historical,
            )
        except NonFiniteMetricError:
            continue
        if decision.promote:
            champion = v
    return champion.version if champion else None


def check_champion(versions: Iterable[VersionState], actual: str | None, **rule: Any) -> list[Finding]:
    """The champion alias is where :func:`expected_champion` says."""
    expected = expected_champion(versions, **rule)
    if (None if actual is None else str(actual)) == expected:
        return []
    return [
        Finding(
            "misdecided", "champion", f"champion is {_v(actual)}, the promotion rule picks {_v(expected)}"
        )
    ]


def _v(version: str | None) -> str:
    return f"v{version}" if version is not None else "none"


# -- the cluster ----------------------------------------------------------------------------------
def check_jobs(jobs: Iterable[Mapping[str, Any]], tries: Mapping[tuple[str, str, str], str]) -> list[Finding]:
    """No Ray job is PENDING or RUNNING for an Airflow try that is no longer alive, nor for an earlier try
    beside a later try's own job (a retry that reattached owns the earlier job: one job, no finding).

    :param jobs: the Jobs API's jobs (``submission_id``, ``status``, ``metadata``).
    :param tries: the state of each task instance, by ``(dag_id, run_id, task_id)``; a missing one is dead.
    """
    out = []
    active: dict[tuple[str, str, str], list[tuple[int, str]]] = {}
    for job in jobs:
        meta = job.get("metadata") or {}
        if job.get("status") not in ACTIVE_JOB_STATES or "airflow_task_id" not in meta:
            continue
        key = (meta.get("airflow_dag_id", ""), meta.get("airflow_run_id", ""), meta["airflow_task_id"])
        state = tries.get(key)
        if state not in LIVE_TI_STATES:
            out.append(
                Finding(
                    "orphaned",
                    "ray job",
                    f"{job.get('submission_id')} is {job.get('status')} but "
                    f"{'.'.join(key)} try {meta.get('airflow_try_number')} is {state or 'gone'}",
                )
            )
            continue
        text = str(meta.get("airflow_try_number") or "0")
        active.setdefault(key, []).append((int(text) if text.isdigit() else 0, str(job.get("submission_id"))))
    for key, found in sorted(active.items()):
        latest = max(found)
        for earlier, submission_id in sorted(found)[:-1]:
            out.append(
                Finding(
                    "orphaned",
                    "ray job",
                    f"{submission_id} of try {earlier} of {'.'.join(key)} is "
                    f"still active beside try {latest[0]}'s job {latest[1]}",
                )
            )
    return out


def check_warm_pools(
    actors: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]], *, now_s: float, idle_s: float
) -> list[Finding]:
    """No warm pool outlives its idle timeout: once no job has run for ``idle_s`` (the pools' idle
    timeout plus the lease timeout), a pool still alive holds a lease nobody beats, or ignores it.

    :param actors: the warm pools' actors (``name``, ``namespace``, ``state``).
    :param jobs: the Jobs API's jobs (``status``, ``end_time`` in ms).
    """
    jobs = list(jobs)
    if any(j.get("status") in ACTIVE_JOB_STATES for j in jobs):
        return []
    last_end = max((float(j.get("end_time") or 0) / 1000 for j in jobs), default=0.0)
    quiet = now_s - last_end
    if quiet < idle_s:
        return []
    return [
        Finding(
            "orphaned",
            "warm pool",
            f"{a.get('namespace')}/{a.get('name')} is alive {quiet:.0f} s after the last job ended",
        )
        for a in actors
        if a.get("state") == "ALIVE"
    ]


def find_secrets(texts: Mapping[str, str], secrets: Iterable[str]) -> list[Finding]:
    """Each log (``texts``, by where it came from) that holds a secret, plain or URL-quoted."""
    forms = {form: s for s in secrets if s and len(s) >= 8 for form in (s, quote(s, safe=""))}
    found = {(where, s) for where, text in texts.items() for form, s in forms.items() if form in text}
    return [
        Finding("leaked", "secret", f"{where} holds a secret ({len(s)} characters, starts {s[:3]!r}...)")
        for where, s in sorted(found)
    ]


# -- the table ------------------------------------------------------------------------------------
def run_partition(run: Mapping[str, Any]) -> str | None:
    """The partition an Airflow run processes (the DAGs' ``PARTITION_TEMPLATE``, from the REST API's run)."""
    return partition_of(
        (run.get("conf") or {}).get("partition"), run.get("logical_date"), run.get("run_after")
    )


def count_faults(fault_log: Iterable[str]) -> dict[str, int]:
    """Faults injected by kind, from a fault log (one JSON object with a ``kind`` per line); one that
    logged an ``error`` or ``skipped`` (nothing to hit) was not injected."""
    kinds: Counter[str] = Counter()
    for line in fault_log:
        if line.strip() and not {"error", "skipped"} & set(record := json.loads(line)):
            kinds[str(record["kind"])] += 1
    return dict(sorted(kinds.items()))


def totals(findings: Iterable[Finding]) -> dict[str, int]:
    counts = Counter(f.line for f in findings)
    return {line: counts.get(line, 0) for line in LINES}


def table(faults: Mapping[str, int], retries: int, findings: list[Finding]) -> str:
    """The audit's table: faults by kind, retries, then each line that must be 0, then the findings."""
    rows = [("faults injected", str(sum(faults.values())))]
    rows += [(f"  {kind}", str(n)) for kind, n in faults.items()]
    rows.append(("retries", str(retries)))
    rows += [(f"{line} (must be 0)", str(n)) for line, n in totals(findings).items()]
    width = max(len(label) for label, _ in rows)
    text = [f"| {'line'.ljust(width)} | count |", f"|{'-' * (width + 2)}|-------|"]
    text += [f"| {label.ljust(width)} | {value.rjust(5)} |" for label, value in rows]
    text += [f"- {f.line}: {f.check}: {f.what}" for f in findings]
    return "\n".join(text)


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when every line that must be 0 is, else 1."""
    return 1 if any(True for _ in findings) else 0
