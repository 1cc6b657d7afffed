"""Benchmark: where a run of the tabular DAG spends its time, per task and per partition size, and what a
backfill gets out of the cluster.

**Sizes.** On one warm local stack (Ray head, COS stand-in, MLflow; started once, then a warm-up run),
``airflow dags test retrain_tabular <date>`` runs the DAG's real operators on a raw partition of each
``--sizes`` row count (``include.data.synthetic``), with the DAG's settings (5 epochs, 2 workers). Each
Ray task's wall time is split, from Airflow's task instance, the Jobs API and the job's own ``usage``
(:mod:`emr_ray.cluster.jobs._usage`):

- ``airflow_start``: task start -> job submitted (render, connections, code shipping, spec);
- ``submit_to_running``: submitted -> the job's driver process started (runtime env, supervisor);
- the job's phases (Spark: ``startup`` = interpreter and imports, ``check_input``, ``ray_connect``,
  ``spark_start`` (a job's own session) or ``spark_session`` (reaching a shared one), ``read``,
  ``compute``, ``write``, ``commit``, ``spark_stop``; training: ``startup``, ``check_inputs``,
  ``ray_connect``, ``plan``, ``mlflow_start`` (the driver's; a warm group's rank 0 starts the run
  inside ``worker_group``), ``build_trainer``, ``worker_group`` (fit less its epochs: worker group
  start, loop set-up, checkpoints, reports), ``epochs`` (the epochs' own seconds, from their
  ``train_rows / rows_per_second`` metrics in MLflow), ``log`` (model, loss curve, champion
  comparison, final metrics));
- ``job_exit``: the job's result -> the Jobs API's end time; ``airflow_finish``: job end -> task end
  (last poll, log tail, XCom).

The other tasks (sensor, cluster check, short-circuit, MLflow registration) are reported whole. For
each component a least-squares line over the sizes separates the **fixed** part (intercept, s) from
the part that **grows** (s per 1M rows).

**Backfill.** A running Airflow on the same stack (``devstack.airflow.LocalAirflow``: PostgreSQL,
LocalExecutor, deferrable operators, the Ray pools sized from the cluster) backfills
``--backfill-days`` partitions of ``--backfill-rows`` rows with the DAG's settings
(``max_active_runs``, pools). Reported: total wall against N x one partition (the ``dags test`` run of
that size, when this run measured it), and cluster utilisation: CPU-seconds reserved by the Ray jobs
(their ``usage``) over the cluster's CPUs x the backfill's wall, how many Ray jobs ran at once, and how
much of the wall no Ray job ran at all (Airflow between tasks).

**Contenders.** ``--contenders job,shared,warm`` runs everything above once per contender, each a
setting of the DAG's ``spark_session`` and ``worker_group`` Params (``--conf``, :data:`CONTENDERS`),
side by side on the same stack: ``job`` (each preprocessing job starts and stops Spark on Ray, each
training job has Ray Train start a worker group: the path before issue 17), ``shared`` (a warm Spark
session that outlives the job, :mod:`emr_ray.cluster.jobs.spark_session`; Ray Train's group per training)
and ``warm`` (both warm: the Spark session and a training worker group that outlives the job,
:mod:`emr_ray.cluster.jobs.train_group`). Each contender gets a warm-up run, then its sizes; one contender
after the other (alternating them would have one contender's cold jobs evict the other's idle warm
pools on a small cluster). Each contender also sets how long its Ray tasks watch their job before
deferring (:data:`DEFER_AFTER`, the DAGs' ``emr_ray_defer_after`` Variable): ``warm`` watches 30 s,
``warm_defer_at_once`` is ``warm`` deferring at once, ``job`` defers at once as before issue 17
(the DAGs watch 30 s: ``warm_rest_watch`` against ``warm_rest``). The table at the end puts whole runs, each
task's fixed part and the backfills side by side with their ratios. The head has 3 CPUs by default: a warm session's executor
(1) and the 2 training workers fit at once (on 2 CPUs each warm pool releases the other for every
task, and the warm paths cost about what ``job`` does). Each backfill's Ray pools (``ray_spark`` for
preprocessing, ``ray_train`` for training) are sized from the lanes of the cluster for the
contender's path (:func:`pool_slots`): on the 3-CPU head one slot each on the cold path, two each on
the warm ones (one job running in the warm replica, the next waiting at it); on every path one run's
training can overlap the next one's preprocessing.

Run inside the loopback-only namespace, in pieces if need be::

    bash scripts/loopback.sh .venv/bin/python -m bench.pipeline --sizes 20000,200000 --no-backfill
    bash scripts/loopback.sh .venv/bin/python -m bench.pipeline --sizes "" --backfill-days 7
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._common import REPO, STATE, machine, table, write_json
from emr_ray.provider_info import DEFERRAL_SETTLE_SECONDS
from emr_ray.sizing.model import linear_fit

DAG_ID = "retrain_tabular"
RAY_TASKS = ("preprocess", "train")
SPARK_PHASES = ("startup", "check_input", "ray_connect", "spark_start", "spark_session", "read", "compute", "write",
                "commit", "spark_stop")  # fmt: skip
TRAIN_PHASES = ("startup", "check_inputs", "ray_connect", "plan", "mlflow_start", "build_trainer", "worker_group",
                "epochs", "log")  # fmt: skip
FIRST_SIZE_DATE = dt.date(2026, 9, 1)  # one date per size; the backfill's dates follow them
WARMUP_DATE, WARMUP_ROWS = "2026-08-31", 2000
#: each contender's run conf: the DAG's Params that choose the cold or the warm path of each Ray task
CONTENDERS = {
    "job": {"spark_session": "job", "worker_group": "job"},
    "shared": {"spark_session": "shared", "worker_group": "job"},
    "warm": {"spark_session": "shared", "worker_group": "shared"},
    "warm_defer_at_once": {"spark_session": "shared", "worker_group": "shared"},
    "warm_queue3": {"spark_session": "shared", "worker_group": "shared"},
    "warm_rest": {"spark_session": "shared", "worker_group": "shared"},
    "warm_rest_runs16": {"spark_session": "shared", "worker_group": "shared"},
    "warm_rest_upstream": {"spark_session": "shared", "worker_group": "shared"},
    "warm_rest_settle0": {"spark_session": "shared", "worker_group": "shared"},
    "warm_rest_watch": {"spark_session": "shared", "worker_group": "shared"},
}
#: contenders whose tasks and jobs reach MLflow through its tracking server (REST, as a deployment
#: does and the chaos soak; the server over the same store): the others open the store itself
#: (SQLAlchemy), which costs each registration about 0.65 s of imports before its first query
MLFLOW_SERVER = {
    "warm_rest",
    "warm_rest_runs16",
    "warm_rest_upstream",
    "warm_rest_settle0",
    "warm_rest_watch",
}
#: runs of a backfill active at once, where a contender differs from the DAGs' ``MAX_ACTIVE_RUNS``:
#: by Little's law a backfill keeps ``max_active_runs / run latency`` runs per second moving, and a
#: run's latency grows with the queues at the Ray pools
MAX_ACTIVE_RUNS_OF = {"warm_rest_runs16": 16}
#: Airflow settings of a contender's running Airflow: ``warm_rest_upstream`` ranks a task by its
#: upstream tasks (Airflow's default ranks it by its downstream ones): where tasks wait for a worker
#: slot, a run's training and registration go before the next runs' sensors and cluster checks
AIRFLOW_CONFIG_OF = {"warm_rest_upstream": {"AIRFLOW__CORE__DEFAULT_TASK_WEIGHT_RULE": "upstream"}}
#: how long a contender's Ray triggers hold a finished job's event after the deferral, where it differs
#: from the provider's ``[emr_ray] deferral_settle_seconds``: ``warm_rest_settle0`` answers at once, as
#: before the hold, so the backfill's retries from Airflow's deferral race show beside the hold's cost
DEFERRAL_SETTLE_OF = {"warm_rest_settle0": 0.0}
#: slots of each Ray pool per warm lane, where a contender differs from the sizing rule's
#: (``emr_ray.sizing.model.WARM_SLOTS_PER_LANE``): ``warm_queue3`` has two tasks' jobs wait at a busy
#: replica instead of one, so the Airflow side of the next task has two calls' time to get there
WARM_SLOTS_PER_LANE = {"warm_queue3": 3}
#: how long each contender's Ray tasks watch their job before deferring (the DAGs'
#: ``emr_ray_defer_after`` Variable, set in the environment of its runs): the path before issue 17
#: deferred at once; ``warm`` against ``warm_defer_at_once`` shows what watching does, and
#: ``warm_rest_watch`` against ``warm_rest`` what it does to Airflow's own CPU: a job that ends while
#: its task watches needs no deferral and no second task process
#: a task's own start in ``airflow dags test``'s log (the execution API's "Task started")
TASK_STARTED = re.compile(r"^(?P<at>\S+Z) \[info\s*\] Task started .* ti_id=(?P<ti_id>[0-9a-f-]+)")
DEFER_AFTER = {
    "job": 0,
    "shared": 30,
    "warm": 30,
    "warm_defer_at_once": 0,
    "warm_queue3": 0,
    "warm_rest": 0,
    "warm_rest_runs16": 0,
    "warm_rest_upstream": 0,
    "warm_rest_settle0": 0,
    "warm_rest_watch": 30,
}


def use_contender(name: str, stack: Any = None) -> None:
    """Set the contender's Variables for the ``dags test`` runs and the Airflow started after this, and
    where ``stack``'s ``mlflow_default`` points (:data:`MLFLOW_SERVER`)."""
    os.environ["AIRFLOW_VAR_EMR_RAY_DEFER_AFTER"] = str(DEFER_AFTER[name])
    for settings in AIRFLOW_CONFIG_OF.values():
        for key in settings:
            os.environ.pop(key, None)
    os.environ.update(AIRFLOW_CONFIG_OF.get(name, {}))
    if stack is not None:
        server = name in MLFLOW_SERVER
        stack.connection_overrides = {"mlflow_default": {"host": stack.mlflow_ui_url}} if server else {}


# -- report maths (pure) ----------------------------------------------------------------------------
def split_task(
    ti: dict[str, float], job: dict[str, Any], usage: dict[str, Any], epochs_s: float | None
) -> dict:
    """One Ray task's wall time (task start -> end) in components, in the order they happen."""
    phases = dict(usage.get("phases") or {})
    parts: dict[str, float] = {"airflow_start": job["submitted"] - ti["start"]}
    parts["submit_to_running"] = usage["started_at"] - job["submitted"]
    if "fit" in phases:  # training: fit = worker group (start, set-up, checkpoints, reports) + epochs
        fit = phases.pop("fit")
        phases["worker_group"] = fit - (epochs_s or 0.0)
        phases["epochs"] = epochs_s or 0.0
    order = SPARK_PHASES if "read" in phases else TRAIN_PHASES
    for name in order:
        if name in phases or name not in ("spark_start", "spark_session", "spark_stop"):
            parts[name] = phases.pop(name, 0.0)  # a job's own session or a shared one: only its phases
    parts["job_other"] = usage["wall_seconds"] - sum(parts.get(n, 0.0) for n in order) - sum(phases.values())
    parts.update(phases)  # any phase the job added since
    parts["job_exit"] = job["ended"] - usage["ended_at"]
    parts["airflow_finish"] = ti["end"] - job["ended"]
    return {k: round(v, 2) for k, v in parts.items()}


def pool_slots(cpus: float, conf: dict[str, Any], contender: str = "") -> int:
    """Slots of each Ray pool (``ray_spark``, ``ray_train``) for a contender, as the README's sizing
    rule says (a lane being a Spark job and a training side by side): two per lane on the warm pools
    when the preprocessing runs in a shared Spark session (or the contender's own count), else one
    (each job starts its own)."""
    from emr_ray.sizing.model import WARM_SLOTS_PER_LANE as RULE
    from emr_ray.sizing.model import ray_pool_slots

    per_lane = WARM_SLOTS_PER_LANE.get(contender, RULE)
    return ray_pool_slots(cpus, warm=conf.get("spark_session") == "shared", warm_slots_per_lane=per_lane)


def busy_timeline(spans: list[tuple[float, float]], start: float, end: float) -> dict[str, float]:
    """How much of ``[start, end]`` had no job running, and the most jobs running at once."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = most = 0
    idle = 0.0
    last = start
    for when, change in events:
        if running == 0:
            idle += max(when - last, 0.0)
        running += change
        most = max(most, running)
        last = when
    idle += max(end - last, 0.0) if running == 0 else 0.0
    return {"idle_s": round(idle, 1), "max_concurrent_jobs": most}


def lane_gaps(jobs: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Where one warm lane (the jobs of one task kind, each a call on the lane's pool) sat idle.

    Each job: ``submitted`` and ``ended`` (the Jobs API's, epoch s), ``held_s`` (its call's seconds)
    and ``idle_before_s`` (how long the pool sat idle before its call, as the pool reported it). A gap
    before a call is split into the seconds no job was waiting yet (the next task's job was submitted
    after the previous job ended: Airflow's side) and the rest (the job's own way to the pool: Ray's
    job start-up, the driver's imports and checks). The first call's gap (the pool's idle before the
    backfill) is not counted."""
    ordered = sorted(jobs, key=lambda j: j["ended"])
    gaps = {"not_submitted_s": 0.0, "job_start_s": 0.0}
    for before, job in zip(ordered, ordered[1:], strict=False):
        gap = max(float(job["idle_before_s"]), 0.0)
        late = min(max(job["submitted"] - before["ended"], 0.0), gap)
        gaps["not_submitted_s"] += late
        gaps["job_start_s"] += gap - late
    busy = sum(float(j["held_s"]) for j in jobs)
    return {"calls": len(jobs), "busy_s": round(busy, 1), "busy_share": round(busy / wall, 3) if wall else 0.0,
            **{k: round(v, 1) for k, v in gaps.items()}}  # fmt: skip


def utilisation_ceiling(reserved: float, cpus: float, lanes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The utilisation the backfill would reach if its busiest warm lane never sat idle: the CPU-s its
    jobs reserved over the CPUs x that lane's seconds of calls (the shortest the wall could be with
    the same calls). The measured utilisation is this ceiling x the lane's busy share, so the ceiling
    says what cutting the gaps between calls can win, and what only other lanes' shapes can."""
    if not lanes or not cpus:
        return {}
    task_id, lane = max(lanes.items(), key=lambda item: item[1]["busy_s"])
    if not lane["busy_s"]:
        return {}
    return {
        "lane": task_id,
        "busy_s": lane["busy_s"],
        "utilisation": round(reserved / (cpus * lane["busy_s"]), 3),
    }


def lanes(jobs: dict[tuple[str, str], dict[str, Any]], wall: float) -> dict[str, dict[str, Any]]:
    """:func:`lane_gaps` of each warm lane (the jobs that borrowed a warm pool), by task id."""
    per_task: dict[str, list[dict[str, Any]]] = {}
    for (_, task_id), job in jobs.items():
        usage = job["result"].get("usage", {})
        held = [v["seconds"] for k, v in usage.get("held", {}).items() if k.startswith("actor:Shared")]
        if held:
            per_task.setdefault(task_id, []).append({
                "submitted": job["submitted"], "ended": job["ended"], "held_s": sum(held),
                "idle_before_s": usage.get("pool_idle", {}).get("seconds", 0.0),
            })  # fmt: skip
    return {task_id: lane_gaps(js, wall) for task_id, js in per_task.items()}


# -- measuring --------------------------------------------------------------------------------------
def _utc(text: str | None) -> float:
    when = dt.datetime.fromisoformat(str(text))
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def ray_jobs(stack, run_ids: set[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """The Ray jobs of these Airflow runs, by (run id, task id): submission and end times and the result."""
    from ray.job_submission import JobSubmissionClient

    from emr_ray.cluster.spec import RESULT_MARKER, parse_marked

    client = JobSubmissionClient(
        stack.ray.dashboard_url, headers={"Authorization": f"Bearer {stack.ray.token}"}
    )
    jobs: dict[tuple[str, str], dict[str, Any]] = {}
    for info in client.list_jobs():
        meta = info.metadata or {}
        if meta.get("airflow_run_id") not in run_ids or info.status != "SUCCEEDED":
            continue
        result = parse_marked(client.get_job_logs(info.submission_id), RESULT_MARKER) or {}
        key = (meta["airflow_run_id"], meta["airflow_task_id"])
        if key not in jobs or info.start_time > jobs[key]["submitted"] * 1000:  # the last try's job
            jobs[key] = {"submission_id": info.submission_id, "submitted": info.start_time / 1000,
                         "ended": info.end_time / 1000, "result": result}  # fmt: skip
    return jobs


def epoch_seconds(tracking_uri: str, run_id: str) -> float | None:
    """The epochs' own seconds (rank 0): ``train_rows / rows_per_second`` per epoch, from MLflow."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    rows = {m.step: m.value for m in client.get_metric_history(run_id, "train_rows")}
    rates = {m.step: m.value for m in client.get_metric_history(run_id, "rows_per_second")}
    return sum(rows[s] / rates[s] for s in rows if rates.get(s)) or None


def dags_test(
    stack, date: str, conf: dict[str, Any] | None = None
) -> tuple[float, subprocess.CompletedProcess]:
    cmd = [str(Path(sys.executable).with_name("airflow")), "dags", "test", DAG_ID, date]
    if conf:
        cmd += ["--conf", json.dumps(conf)]
    env = os.environ | stack.dags_test_env()
    started = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    # the run's own log, to read where a task's seconds went
    (Path(env["AIRFLOW_HOME"]) / f"dags-test-{date}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise RuntimeError(f"dags test {date} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.monotonic() - started, done


def task_instances(stack, date: str) -> tuple[str, dict[str, dict[str, float]]]:
    """The latest ``dags test`` run of ``date`` and its task instances' start and end (SQLite)."""
    db = sqlite3.connect(Path(stack.dags_test_env()["AIRFLOW_HOME"]) / "airflow.db")
    try:
        (run_id,) = db.execute(
            "SELECT run_id FROM dag_run WHERE dag_id = ? AND logical_date LIKE ? ORDER BY id DESC LIMIT 1",
            (DAG_ID, f"{date}%"),
        ).fetchone()
        rows = db.execute(
            "SELECT task_id, start_date, end_date, id FROM task_instance WHERE dag_id = ? AND run_id = ?",
            (DAG_ID, run_id),
        ).fetchall()
    finally:
        db.close()
    return run_id, {t: {"start": _utc(s), "end": _utc(e), "id": str(i)} for t, s, e, i in rows if s and e}


def task_started(log: str) -> dict[str, float]:
    """When each task instance's own code started (its "Task started" line), by task instance id."""
    started: dict[str, float] = {}
    for line in log.splitlines():
        match = TASK_STARTED.match(line)
        if match:
            started.setdefault(match["ti_id"].replace("-", ""), _utc(match["at"].replace("Z", "+00:00")))
    return started


def without_harness(tis: dict[str, dict[str, Any]], started: dict[str, float]) -> float:
    """Moves each task's start to its "Task started" line; returns the seconds that moved.

    ``airflow dags test`` starts its in-process execution API when its first task starts (2.7-3.7 s
    here): a cost of the test harness, which a running Airflow does not pay per task. Left in, it would
    count as the first task's (the sensor's) fixed cost."""
    moved = 0.0
    for ti in tis.values():
        own = started.get(str(ti.get("id")).replace("-", ""))
        if own is not None and own > ti["start"]:
            moved += own - ti["start"]
            ti["start"] = own
    return moved


def measure_size(stack, rows: int, date: str, conf: dict[str, Any] | None = None) -> dict[str, Any]:
    load_before = round(os.getloadavg()[0], 2)
    total, done = dags_test(stack, date, conf)
    run_id, tis = task_instances(stack, date)
    harness = without_harness(tis, task_started(done.stdout + done.stderr))
    jobs = ray_jobs(stack, {run_id})
    tasks: dict[str, Any] = {}
    for task_id, ti in tis.items():
        job = jobs.get((run_id, task_id))
        if task_id not in RAY_TASKS or not job:
            tasks[task_id] = {"total": round(ti["end"] - ti["start"], 2)}
            continue
        result = job["result"]
        epochs = epoch_seconds(stack.tracking_uri, result["mlflow_run_id"]) if task_id == "train" else None
        parts = split_task(ti, job, result["usage"], epochs)
        tasks[task_id] = parts | {"total": round(ti["end"] - ti["start"], 2)}
        tasks[task_id]["usage"] = result["usage"]
    first = min(t["start"] for t in tis.values())
    last = max(t["end"] for t in tis.values())
    return {
        "rows": rows,
        "date": date,
        "run_id": run_id,
        "dags_test_s": round(total, 1),
        "dags_test_harness_s": round(harness, 2),
        "tasks_span_s": round(last - first, 1),
        "tasks": tasks,
        "load1_before_after": [load_before, round(os.getloadavg()[0], 2)],
    }


def fits(sizes: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Fixed seconds and seconds per 1M rows of each task's components, over the sizes."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for task_id in sizes[0]["tasks"] if sizes else []:
        components = [k for k, v in sizes[0]["tasks"][task_id].items() if isinstance(v, (int, float))]
        for name in components:
            points = [(s["rows"], s["tasks"][task_id].get(name, 0.0)) for s in sizes if task_id in s["tasks"]]
            line = linear_fit(points)
            if line:
                out.setdefault(task_id, {})[name] = {"fixed_s": round(line[0], 2),
                                                     "s_per_1M_rows": round(line[1] * 1e6, 2)}  # fmt: skip
    return out


def backfill(
    stack, days: int, rows: int, first: dt.date, conf: dict[str, Any] | None = None, cpus: float | None = None,
    contender: str = "",
) -> dict[str, Any]:  # fmt: skip
    """A backfill of ``days`` dates through a running Airflow, with the DAG's own settings; the
    Ray pools sized for the contender's path (:func:`pool_slots`) from ``cpus``, the cluster's CPUs
    (default: the stack's head alone; more where nodes joined it)."""
    from devstack.airflow import LocalAirflow
    from emr_ray.params import MAX_ACTIVE_RUNS

    max_active_runs = MAX_ACTIVE_RUNS_OF.get(contender, MAX_ACTIVE_RUNS)
    from devstack.airflow_client import Api, backfill_runs, wait_for_runs

    dates = [(first + dt.timedelta(days=i)).isoformat() for i in range(days)]
    cpus = float(cpus or stack.num_cpus)
    slots = pool_slots(cpus, conf or {}, contender)
    settle = DEFERRAL_SETTLE_OF.get(contender, DEFERRAL_SETTLE_SECONDS)
    airflow = LocalAirflow(stack, stack.root / "airflow-live", port=8080, pool_slots=slots,
                           deferral_settle_s=settle).start()  # fmt: skip
    try:
        api = Api(airflow)
        api.unpause_once_parsed(DAG_ID, timeout_s=300)  # once the DAG processor parsed it
        body = {"dag_id": DAG_ID, "from_date": f"{dates[0]}T00:00:00Z", "to_date": f"{dates[-1]}T00:00:00Z",
                "reprocess_behavior": "completed", "max_active_runs": max_active_runs, "dag_run_conf": conf or {}}  # fmt: skip
        airflow_cpu_before = airflow.cpu_seconds()
        started = time.time()
        created = api.call("POST", "/api/v2/backfills", body)
        runs = list(backfill_runs(api, dates).values())
        # unpausing also made the scheduled run of the latest day: not ours (its sensor only waits)
        for run in api.runs("&run_type=scheduled"):
            api.call("PATCH", f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}", {"state": "failed"})
        finished = wait_for_runs(api, {r["dag_run_id"] for r in runs}, timeout=4 * 3600)
        ended = max(_utc(r["end_date"]) for r in finished.values())
        try:  # its runs are done; the scheduler may not have closed it yet, and the next one needs that
            api.call("PUT", f"/api/v2/backfills/{created['id']}/cancel", retries=1)
        except AssertionError:
            pass  # already closed
        api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": True})
        airflow_cpu = cpu_spent(airflow_cpu_before, airflow.cpu_seconds())
        tries = [api.task_instances(run_id) for run_id in finished]
        retried = retried_tries([ti for run in tries for ti in run.values()])
        processes = task_processes(api.event_logs("running"), set(finished))
    finally:
        airflow.stop()
    jobs = ray_jobs(stack, set(finished))
    wall = ended - started
    reserved = sum(j["result"].get("usage", {}).get("cpu_seconds_reserved", 0.0) for j in jobs.values())
    per_task: dict[str, list[float]] = {}
    for (_, task_id), job in jobs.items():
        per_task.setdefault(task_id, []).append(
            job["result"].get("usage", {}).get("cpu_seconds_reserved", 0.0)
        )
    durations = sorted(_utc(r["end_date"]) - _utc(r["start_date"]) for r in finished.values())
    by_lane = lanes(jobs, wall)
    return {
        "days": days,
        "rows": rows,
        "dates": dates,
        "states": sorted(r["state"] for r in finished.values()),
        "wall_s": round(wall, 1),
        "started_at": round(started, 2),
        "ended_at": round(ended, 2),
        "run_seconds_median": round(statistics.median(durations), 1),
        "ray_pool_slots": slots,
        "max_active_runs": max_active_runs,
        "cluster_cpus": cpus,
        "cpu_seconds_reserved": round(reserved, 1),
        "cpu_seconds_reserved_per_task": {k: round(sum(v), 1) for k, v in per_task.items()},
        "utilisation": round(reserved / (cpus * wall), 3),
        "jobs": len(jobs),
        **busy_timeline([(j["submitted"], j["ended"]) for j in jobs.values()], started, ended),
        "lanes": by_lane,
        "ceiling": utilisation_ceiling(reserved, cpus, by_lane),
        "load1_end": round(os.getloadavg()[0], 2),
        "airflow_cpu_seconds": airflow_cpu,
        "airflow_cpu_seconds_per_partition": round(sum(airflow_cpu.values()) / days, 1),
        "cluster_cpu_seconds_per_partition": round(reserved / days, 1),
        "deferral_settle_s": settle,
        "retried_tries": retried,
        "task_processes": processes,
        "task_processes_per_partition": round(sum(processes.values()) / days, 2),
    }


def retried_tries(task_instances: list[dict[str, Any]]) -> dict[str, int]:
    """Tries beyond the first, per task id, over a backfill's task instances (the API's answers)."""
    retried: dict[str, int] = {}
    for ti in task_instances:
        if (extra := int(ti.get("try_number") or 1) - 1) > 0:
            retried[ti["task_id"]] = retried.get(ti["task_id"], 0) + extra
    return retried


def task_processes(running_events: list[dict[str, Any]], run_ids: set[str]) -> dict[str, int]:
    """Task processes started, per task id, over the runs ``run_ids``: one per ``running`` audit-log
    entry (a try's start, and each resume after a deferral), the unit Airflow's own CPU is spent in."""
    started: dict[str, int] = {}
    for event in running_events:
        if event.get("run_id") in run_ids and event.get("task_id"):
            started[event["task_id"]] = started.get(event["task_id"], 0) + 1
    return started


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each Airflow component's CPU-seconds between two readings of ``LocalAirflow.cpu_seconds``."""
    return {name: round(after[name] - before.get(name, 0.0), 1) for name in after}


# -- output -----------------------------------------------------------------------------------------
def report(result: dict[str, Any]) -> str:
    sizes = result.get("sizes", [])
    text = [f"pipeline: load average at start {result['machine']['loadavg_at_start']}"]
    if sizes:
        headers = (
            ["task / component"] + [f"{s['rows']:,} rows s" for s in sizes] + ["fixed s", "s per 1M rows"]
        )
        rows = []
        for task_id in sizes[0]["tasks"]:
            first = sizes[0]["tasks"][task_id]
            for name in first:
                if name == "usage":
                    continue
                cells = [f"{s['tasks'].get(task_id, {}).get(name, 0.0):.1f}" for s in sizes]
                fit = result.get("fits", {}).get(task_id, {}).get(name)
                label = f"**{task_id}**" if name == "total" else f"{task_id} / {name}"
                rows.append([label, *cells, f"{fit['fixed_s']:.1f}" if fit else "-",
                             f"{fit['s_per_1M_rows']:.1f}" if fit else "-"])  # fmt: skip
        fixed = [f["total"]["fixed_s"] for f in result.get("fits", {}).values() if "total" in f]
        rows.append(["**every task's fixed part, summed**", *["" for _ in sizes],
                     f"{sum(fixed):.1f}" if fixed else "-", "-"])  # fmt: skip
        rows.append(["dags test start-up (execution API; not a task's)",
                     *[f"{s.get('dags_test_harness_s', 0.0):.1f}" for s in sizes], "-", "-"])  # fmt: skip
        rows.append(["**dags test, whole run**", *[f"{s['dags_test_s']:.1f}" for s in sizes], "-", "-"])
        rows.append(["load1 before / after", *[" / ".join(map(str, s["load1_before_after"])) for s in sizes],
                     "-", "-"])  # fmt: skip
        text += ["", table(headers, rows)]
        for s in sizes:
            for task_id in RAY_TASKS:
                usage = s["tasks"].get(task_id, {}).get("usage")
                if usage:
                    text.append(f"- {s['rows']:,} rows, {task_id}: {usage['wall_seconds']:.1f} s job wall, "
                                f"{usage['cpu_seconds_reserved']:.1f} CPU-s reserved, held "
                                + ", ".join(f"{k} x{v['count']} {v['cpu_seconds']:.1f} CPU-s"
                                            for k, v in usage.get("held", {}).items()))  # fmt: skip
    b = result.get("backfill")
    if b:
        one = next((s["dags_test_s"] for s in sizes if s["rows"] == b["rows"]), None)
        text += [
            "",
            f"backfill of {b['days']} x {b['rows']:,} rows: {b['wall_s']:.0f} s wall"
            + (
                f" against {b['days']} x {one:.0f} s = {b['days'] * one:.0f} s one after another "
                f"({b['wall_s'] / (b['days'] * one):.2f}x)"
                if one
                else ""
            )  # fmt: skip
            + f"; run states {b['states']}; median run {b['run_seconds_median']:.0f} s",
            f"- cluster utilisation {b['utilisation']:.0%}: {b['cpu_seconds_reserved']:.0f} CPU-s reserved by "
            f"{b['jobs']} Ray jobs ({b['cpu_seconds_reserved_per_task']}) over {b['cluster_cpus']:.0f} CPUs x "
            f"{b['wall_s']:.0f} s",
            f"- at most {b['max_concurrent_jobs']} Ray job(s) at once (ray_spark and ray_train pools: "
            f"{b['ray_pool_slots']} slot(s) each; max_active_runs {b['max_active_runs']}); no Ray job "
            f"running for {b['idle_s']:.0f} s of the {b['wall_s']:.0f} s",
        ]
        if "retried_tries" in b:
            text.append(f"- tries beyond the first: {sum(b['retried_tries'].values())} "
                        f"({b['retried_tries'] or 'none'}); triggers hold a finished job's event "
                        f"{b['deferral_settle_s']:g} s after the deferral")  # fmt: skip
        if "task_processes" in b:
            text.append(f"- task processes started: {b['task_processes_per_partition']:.1f} per partition "
                        f"({b['task_processes']})")  # fmt: skip
        if "airflow_cpu_seconds" in b:
            text.append(f"- Airflow's own processes used {b['airflow_cpu_seconds_per_partition']:.1f} CPU-s per "
                        f"partition ({b['airflow_cpu_seconds']}), the cluster's jobs reserved "
                        f"{b['cluster_cpu_seconds_per_partition']:.1f}")  # fmt: skip
        for task_id, lane in b.get("lanes", {}).items():
            text.append(f"- {task_id}'s warm pool: busy {lane['busy_share']:.0%} of the wall ({lane['calls']} calls, "
                        f"{lane['busy_s']:.0f} s); idle between calls {lane['not_submitted_s']:.0f} s before the next "
                        f"job was submitted (Airflow's side), {lane['job_start_s']:.0f} s while it made its way "
                        "to the pool (Ray's job start-up, the driver's imports and checks)")  # fmt: skip
        if ceiling := b.get("ceiling"):
            text.append(f"- the most this backfill's calls allow: {ceiling['utilisation']:.0%} utilisation, were "
                        f"{ceiling['lane']}'s warm pool never idle ({b['cpu_seconds_reserved']:.0f} CPU-s over "
                        f"{b['cluster_cpus']:.0f} CPUs x its {ceiling['busy_s']:.0f} s of calls); measured "
                        f"{b['utilisation']:.0%}")  # fmt: skip
    return "\n".join(text)


def comparison(per_contender: dict[str, dict[str, Any]]) -> str:
    """The contenders side by side: whole runs per size, the fixed part per task, the backfill."""
    names = list(per_contender)
    if len(names) < 2:
        return ""
    base = names[0]
    rows = []
    sizes = [s["rows"] for s in per_contender[base].get("sizes", [])]
    for i, n in enumerate(sizes):
        cells = [per_contender[c]["sizes"][i]["dags_test_s"] for c in names]
        rows.append([f"whole `dags test` run, {n:,} rows", *[f"{v:.1f}" for v in cells],
                     *[f"{cells[0] / v:.2f}x" for v in cells[1:]]])  # fmt: skip
    for task_id in RAY_TASKS:
        cells = [
            per_contender[c].get("fits", {}).get(task_id, {}).get("total", {}).get("fixed_s") for c in names
        ]
        if all(v is not None for v in cells):
            rows.append([f"{task_id}: fixed part (fit over sizes)", *[f"{v:.1f}" for v in cells],
                         *[f"{cells[0] / v:.2f}x" if v else "-" for v in cells[1:]]])  # fmt: skip
        cells = [statistics.mean(s["tasks"][task_id]["total"] for s in per_contender[c].get("sizes", [])
                                 if task_id in s["tasks"]) if per_contender[c].get("sizes") else None
                 for c in names]  # fmt: skip
        if all(v is not None for v in cells):
            rows.append([f"{task_id}: whole task, mean over sizes", *[f"{v:.1f}" for v in cells],
                         *[f"{cells[0] / v:.2f}x" for v in cells[1:]]])  # fmt: skip
    tasks = [sum(t["total"]["fixed_s"] for t in per_contender[c]["fits"].values()) if per_contender[c].get("fits")
             else None for c in names]  # fmt: skip
    if all(tasks):  # what a partition's tasks cost in a running Airflow, without the CLI's own start and end
        rows.append(["every task's fixed part, summed", *[f"{v:.1f}" for v in tasks],
                     *[f"{tasks[0] / v:.2f}x" for v in tasks[1:]]])  # fmt: skip
    fixed = [per_contender[c].get("fixed_run_s") for c in names]
    if all(v is not None for v in fixed):
        rows.append(["whole run: fixed part (fit over sizes)", *[f"{v:.1f}" for v in fixed],
                     *[f"{fixed[0] / v:.2f}x" for v in fixed[1:]]])  # fmt: skip
    walls = [per_contender[c].get("backfill", {}).get("wall_s") for c in names]
    if all(walls):
        days = per_contender[base]["backfill"]["days"]
        rows.append([f"backfill of {days} partitions, wall", *[f"{v:.0f}" for v in walls],
                     *[f"{walls[0] / v:.2f}x" for v in walls[1:]]])  # fmt: skip
        rows.append(["backfill: seconds per partition", *[f"{v / days:.1f}" for v in walls],
                     *[f"{walls[0] / v:.2f}x" for v in walls[1:]]])  # fmt: skip
        util = [per_contender[c]["backfill"]["utilisation"] for c in names]
        rows.append(["backfill: cluster utilisation", *[f"{u:.0%}" for u in util], *["-" for _ in util[1:]]])
        airflow = [per_contender[c]["backfill"].get("airflow_cpu_seconds_per_partition") for c in names]
        if all(airflow):
            rows.append(["backfill: Airflow CPU-s per partition", *[f"{v:.1f}" for v in airflow],
                         *[f"{airflow[0] / v:.2f}x" for v in airflow[1:]]])  # fmt: skip
        processes = [per_contender[c]["backfill"].get("task_processes_per_partition") for c in names]
        if all(processes):
            rows.append(["backfill: task processes per partition", *[f"{v:.1f}" for v in processes],
                         *[f"{processes[0] / v:.2f}x" for v in processes[1:]]])  # fmt: skip
        retried = [per_contender[c]["backfill"].get("retried_tries") for c in names]
        if all(r is not None for r in retried):
            rows.append(["backfill: tries beyond the first", *[str(sum(r.values())) for r in retried],
                         *["-" for _ in retried[1:]]])  # fmt: skip
    headers = ["figure", *[f"{c} s" for c in names], *[f"{base} / {c}" for c in names[1:]]]
    return "\n".join(["", f"contenders side by side ({' vs '.join(names)}):", "", table(headers, rows)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="20000,200000,1000000", help="raw rows per partition, comma-separated "
                        "('' skips the per-size runs)")  # fmt: skip
    parser.add_argument(
        "--no-backfill", action="store_true", help="skip the backfill through a running Airflow"
    )
    parser.add_argument("--backfill-days", type=int, default=7)
    parser.add_argument("--backfill-rows", type=int, default=200_000)
    parser.add_argument("--cpus", type=int, default=3, help="CPUs of the local Ray head (3: a warm Spark "
                        "session's executor and the 2 training workers fit at once)")  # fmt: skip
    parser.add_argument("--contenders", default="job,shared,warm", help="contenders to run side by side, "
                        f"the first is the baseline: {', '.join(CONTENDERS)}")  # fmt: skip
    parser.add_argument("--no-warmup", action="store_true", help="skip the 2,000-row warm-up runs")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        parser.error(f"--contenders {','.join(unknown)}: use some of {', '.join(CONTENDERS)}")

    from devstack.ports import free_port
    from devstack.stack import LocalStack
    from include.data import synthetic

    root = STATE / "pipeline"
    shutil.rmtree(root, ignore_errors=True)  # each run starts from an empty stack
    started = time.monotonic()
    result: dict[str, Any] = {"machine": machine(), "contenders": {c: {"sizes": []} for c in contenders}}
    per = result["contenders"]
    server = free_port() if MLFLOW_SERVER & set(contenders) else None  # the MLflow server, where one needs it
    stack = LocalStack(
        root, REPO, num_cpus=args.cpus, postgres=not args.no_backfill, mlflow_ui_port=server
    ).start()
    day = FIRST_SIZE_DATE
    try:
        env = os.environ | stack.dags_test_env()
        subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], env=env, check=True,
                       capture_output=True)  # fmt: skip
        options = stack.storage_options()
        # one contender after the other, each after its warm-up run: alternating them would have one
        # contender's cold jobs evict the other's idle warm pools on a small cluster
        for i, contender in enumerate(contenders if sizes else []):
            use_contender(contender, stack)
            if not args.no_warmup:  # its first run pays what a later one need not (pools, caches)
                warm = (dt.date.fromisoformat(WARMUP_DATE) - dt.timedelta(days=i)).isoformat()
                synthetic.write_partitions(stack.raw_uri, warm, 1, WARMUP_ROWS, options)
                per[contender]["warmup_s"] = round(dags_test(stack, warm, CONTENDERS[contender])[0], 1)
                print(f"{contender}: warm-up run {per[contender]['warmup_s']} s", flush=True)
            for rows in sizes:
                date = day.isoformat()
                day += dt.timedelta(days=1)
                synthetic.write_partitions(stack.raw_uri, date, 1, rows, options)
                measured = measure_size(stack, rows, date, CONTENDERS[contender])
                per[contender]["sizes"].append(measured)
                print(f"{contender}, {rows:,} rows: dags test {measured['dags_test_s']} s", flush=True)
        for contender in contenders:
            per[contender]["fits"] = fits(per[contender]["sizes"])
            whole = linear_fit([(s["rows"], s["dags_test_s"]) for s in per[contender]["sizes"]])
            per[contender]["fixed_run_s"] = round(whole[0], 1) if whole else None
        if sizes:  # kept even if the backfill below fails
            write_json("pipeline-sizes.json", result)
        if not args.no_backfill:
            for contender in contenders:
                use_contender(contender, stack)
                first = day + dt.timedelta(days=1)
                day = first + dt.timedelta(days=args.backfill_days)
                synthetic.write_partitions(stack.raw_uri, first.isoformat(), args.backfill_days, args.backfill_rows,
                                           options)  # fmt: skip
                try:
                    per[contender]["backfill"] = backfill(stack, args.backfill_days, args.backfill_rows, first,
                                                          CONTENDERS[contender], contender=contender)  # fmt: skip
                    print(f"{contender}: backfill {per[contender]['backfill']['wall_s']} s", flush=True)
                except Exception as e:  # the per-size figures above are still written
                    per[contender]["backfill_error"] = f"{type(e).__name__}: {e}"
                    print(f"{contender}: backfill failed: {per[contender]['backfill_error']}", flush=True)
    finally:
        stack.stop()
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["total_s"] = round(time.monotonic() - started, 1)
    text = []
    for contender in contenders:
        text += [
            f"## {contender}: {json.dumps(CONTENDERS[contender])}, defer_after {DEFER_AFTER[contender]} s",
            report(per[contender] | {"machine": result["machine"]}),
            "",
        ]
    text.append(comparison(per))
    result["table"] = "\n".join(text)
    name = (
        "pipeline-sizes.json"
        if args.no_backfill
        else ("pipeline-backfill.json" if not sizes else "pipeline.json")
    )
    path = write_json(name, result)
    print(result["table"])
    print(f"\nwritten {path} in {result['total_s']} s total")


if __name__ == "__main__":
    main()
