"""The chaos audit: did a DAG's runs lose, duplicate or orphan anything? Read-only; runs against a real
deployment as against the local stack, through the same Airflow connections the DAGs use::

    python -m bench.audit --dag retrain_tabular --model tabular-mlp \\
        --raw-uri cos://bucket/raw --staged-uri cos://bucket/staging/tabular --dates 2026-10-01:2026-10-30 \\
        --airflow-url https://airflow.example --airflow-user auditor --logs /opt/airflow/logs

For every date: exactly one current generation whose rows equal the raw partition's (footers of the
files its manifest lists, and the rows it read); no generation left uncommitted by a writer that is
gone (``--idle-s``). Every model version names a committed generation and the MLflow run that made
it, one version per Airflow run; the champion is the version the promotion rule picks, replayed in
registration order (a champion a person moved by hand fails this line, as it should be explained).
No Ray job PENDING or RUNNING without a live Airflow try (the Jobs API's ``airflow_*`` metadata, the
REST API's task instance state); no warm pool alive past ``--warm-idle-s`` after the last job; no
secret of the connections (``--secret-conn``) in any log (the files under ``--logs``, and the driver
logs of the DAG's Ray jobs).

It prints a table (faults by kind from ``--fault-log``, retries, then lost, duplicated, orphaned,
misdecided, leaked) and exits 1 unless each of those is 0. The rules are :mod:`bench.audit_rules`.
Nothing is written, except the JSON of ``--json``. Ages are taken with this machine's clock.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.audit_rules import (
    Finding,
    PartitionState,
    VersionState,
    check_champion,
    check_jobs,
    check_partition,
    check_versions,
    check_warm_pools,
    count_faults,
    exit_code,
    find_secrets,
    run_partition,
    table,
    totals,
)

#: the warm pools' Ray namespaces (``emr_ray.cluster.jobs.warm.POOLS``)
WARM_NAMESPACES = ("emr_ray_spark_sessions", "emr_ray_train_groups")
#: bytes read from each log file (the end of a longer one)
LOG_BYTES = 4 << 20


# -- Airflow ---------------------------------------------------------------------------------------
class AirflowApi:
    """Airflow's REST API (v2), read only: a bearer token from ``/auth/token`` or given."""

    def __init__(
        self, url: str, *, user: str | None = None, password: str | None = None, token: str | None = None
    ):
        self.url = url.rstrip("/")
        if token is None:
            body = json.dumps({"username": user, "password": password}).encode()
            answer = self._send("POST", "/auth/token", body, {"Content-Type": "application/json"})
            token = answer["access_token"]
        self.headers = {"Authorization": f"Bearer {token}"}

    def _send(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> Any:
        for attempt in range(5):  # a restarting API server answers 503 for a moment
            request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    return json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as e:
                if e.code not in (500, 502, 503) or attempt == 4:
                    raise
            except OSError:
                if attempt == 4:
                    raise
            time.sleep(3)
        raise AssertionError("unreachable")

    def get(self, path: str) -> Any:
        return self._send("GET", path, headers=self.headers)

    def runs(self, dag_id: str) -> list[dict]:
        found: list[dict] = []
        while True:
            page = self.get(f"/api/v2/dags/{dag_id}/dagRuns?limit=100&offset={len(found)}&order_by=id")
            found += page["dag_runs"]
            if not page["dag_runs"] or len(found) >= page["total_entries"]:
                return found

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        quoted = urllib.parse.quote(run_id, safe="")
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances?limit=1000")["task_instances"]

    def task_state(self, dag_id: str, run_id: str, task_id: str) -> str | None:
        quoted = urllib.parse.quote(run_id, safe="")
        try:
            return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances/{task_id}").get("state")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise


# -- the store -------------------------------------------------------------------------------------
def _parquet_rows(fsys: Any, paths: Iterable[str]) -> int:
    import pyarrow.parquet as pq

    total = 0
    for path in paths:
        with fsys.open_input_file(path) as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def raw_rows(raw_uri: str, date: str, options: Any) -> int | None:
    """Rows of the raw partition of ``date`` (its data files' footers), None when it has none."""
    from pyarrow import fs as pafs

    from emr_ray.cluster import storage

    fsys, root = storage.resolve(storage.join(raw_uri, f"dt={date}"), options)
    infos = fsys.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    files = sorted(i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet"))
    return _parquet_rows(fsys, files) if files else None


def partition_state(raw_uri: str, staged_uri: str, date: str, options: Any, now: float) -> PartitionState:
    """What the store holds for ``date``: the raw rows, the current generation and the uncommitted ones."""
    from pyarrow import fs as pafs

    from emr_ray.cluster import partitions, storage

    partition = storage.join(staged_uri, f"dt={date}")
    fsys, root = storage.resolve(partition, options)
    committed = partitions.current(partition, options)
    declared: dict[str, int] = {}
    found: dict[str, int | None] = {}
    if committed is not None:
        for name, entry in committed.outputs.items():
            declared[name] = int(entry.get("rows", -1))
            try:
                found[name] = _parquet_rows(
                    fsys, [p for p, _ in partitions.dataset_files(committed, name, options)]
                )
            except (storage.StorageError, OSError):
                found[name] = None
    named = {e.generation for e in partitions.commit_log(partition, options)}
    uncommitted: dict[str, float] = {}
    for info in fsys.get_file_info(
        pafs.FileSelector(f"{root}/{partitions.GENERATIONS}", allow_not_found=True)
    ):
        if info.type == pafs.FileType.Directory and partitions.GENERATION_PATTERN.fullmatch(info.base_name):
            if info.base_name not in named:
                inside = fsys.get_file_info(pafs.FileSelector(info.path, recursive=True))
                moments = [i.mtime.timestamp() for i in [info, *inside] if i.mtime is not None]
                uncommitted[info.base_name] = now - max(moments, default=now)
    return PartitionState(
        date,
        raw_rows(raw_uri, date, options),
        committed.generation if committed else None,
        committed.manifest.get("rows_in") if committed else None,
        declared,
        found,
        uncommitted,
    )


# -- the registry ----------------------------------------------------------------------------------
def version_states(
    mlflow_conn_id: str, model: str, metric: str, options: Any
) -> tuple[list[VersionState], str | None]:
    """Every live version of ``model`` with what it names, and the version the champion alias points at."""
    from emr_ray.cluster import partitions, storage
    from emr_ray.cluster.promotion import comparison_from_run
    from emr_ray.hooks.mlflow import MLflowHook

    hook = MLflowHook(mlflow_conn_id)
    states = []
    for v in hook.live_versions(model):
        tags = v.tags or {}
        data_uri, generation = tags.get("data_uri"), tags.get("generation")
        committed = False
        if data_uri and generation:
            try:
                partitions.pinned(data_uri, generation, options if data_uri.startswith("cos://") else None)
                committed = True
            except (storage.StorageError, OSError):
                committed = False
        run = None
        try:
            with hook.credentials():
                run = hook.client.get_run(v.run_id) if v.run_id else None
        except Exception:  # MLflow's "not found" comes as several exception types across stores
            run = None
        run_tags = run.data.tags if run else {}
        metrics = run.data.metrics if run else {}
        matches = run is not None and all(
            run_tags.get(k) == tags.get(k)
            for k in ("data_uri", "generation", "airflow.run_id")
            if tags.get(k)
        )
        states.append(
            VersionState(
                version=str(v.version),
                mlflow_run_id=v.run_id,
                airflow_run_id=tags.get("airflow.run_id"),
                data_uri=data_uri,
                generation=generation,
                generation_committed=committed,
                run_found=run is not None,
                run_matches=matches,
                value=metrics.get(metric),
                partition=tags.get("partition"),
                comparison=comparison_from_run(run_tags, metrics, model_name=model, metric=metric)
                if run
                else None,
            )
        )
    champion = hook.get_aliases(model).get("champion") if states else None
    return states, champion


# -- the cluster -----------------------------------------------------------------------------------
def ray_state(ray_conn_id: str) -> tuple[list[dict], list[dict]]:
    """The Jobs API's jobs and the warm pools' actors (the dashboard's state API)."""
    from emr_ray.hooks.ray import RayHook

    hook = RayHook(ray_conn_id)
    jobs = hook.check_response(hook.client.get("/api/jobs/"))
    answer = hook.check_response(hook.client.get("/api/v0/actors?limit=10000&detail=true"))
    assert jobs is not None and answer is not None
    actors = answer.json().get("data", {}).get("result", {}).get("result", [])
    pools = [
        {"name": a.get("name"), "namespace": a.get("ray_namespace"), "state": a.get("state")}
        for a in actors
        if a.get("ray_namespace") in WARM_NAMESPACES
    ]
    return jobs.json(), pools


def job_logs(ray_conn_id: str, jobs: Iterable[dict], dag_id: str) -> dict[str, str]:
    """The driver logs of the DAG's Ray jobs, by ``ray job <id>``."""
    from emr_ray.hooks.ray import RayHook

    hook = RayHook(ray_conn_id)
    logs = {}
    for job in jobs:
        if (job.get("metadata") or {}).get("airflow_dag_id") == dag_id and job.get("submission_id"):
            try:
                logs[f"ray job {job['submission_id']}"] = hook.get_job_logs(job["submission_id"])
            except Exception as e:  # a job whose driver never started has no log to read
                logs[f"ray job {job['submission_id']}"] = f"(log unreadable: {type(e).__name__})"
    return logs


def log_files(folders: Iterable[str]) -> dict[str, str]:
    texts = {}
    for folder in folders:
        for path in Path(folder).rglob("*"):
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as f:
                    f.seek(max(0, path.stat().st_size - LOG_BYTES))
                    texts[str(path)] = f.read().decode(errors="replace")
    return texts


def connection_secrets(conn_ids: Iterable[str]) -> list[str]:
    """The password of each connection, and the secret-looking fields of its extra."""
    from airflow.sdk import BaseHook

    from emr_ray.cluster.reuse import secret_looking

    found = []
    for conn_id in conn_ids:
        try:
            conn = BaseHook.get_connection(conn_id)
        except Exception:
            continue
        found.append(conn.password or "")
        found += [
            str(v) for k, v in (conn.extra_dejson or {}).items() if isinstance(v, str) and secret_looking(k)
        ]
    return [s for s in found if s]


# -- the whole audit -------------------------------------------------------------------------------
def parse_dates(text: str) -> list[str]:
    """``2026-10-01:2026-10-30`` (inclusive) or ``2026-10-01,2026-10-03``."""
    if ":" in text:
        first, last = (dt.date.fromisoformat(p) for p in text.split(":", 1))
        return [(first + dt.timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]
    return [d.strip() for d in text.split(",") if d.strip()]


def audit(args: argparse.Namespace) -> dict[str, Any]:
    """Read everything, apply the rules; returns the figures, the findings and the table."""
    from emr_ray.housekeeping import storage_options

    uris = (args.raw_uri, args.staged_uri)
    options = storage_options(args.cos_conn_id) if any(u.startswith("cos://") for u in uris) else None
    dates = parse_dates(args.dates)
    now = time.time()
    findings: list[Finding] = []
    for date in dates:
        findings += check_partition(
            partition_state(args.raw_uri, args.staged_uri, date, options, now), idle_s=args.idle_s
        )

    api = AirflowApi(
        args.airflow_url, user=args.airflow_user, password=args.airflow_password, token=args.airflow_token
    )
    runs = [r for r in api.runs(args.dag) if run_partition(r) in dates]
    tries: dict[tuple[str, str, str], str] = {}
    retries, registered = 0, set()
    for run in runs:
        for ti in api.task_instances(args.dag, run["dag_run_id"]):
            tries[(args.dag, run["dag_run_id"], ti["task_id"])] = ti.get("state") or ""
            retries += max(0, int(ti.get("try_number") or 0) - 1)
            if ti["task_id"] == args.register_task and ti.get("state") == "success":
                registered.add(run["dag_run_id"])
        if run.get("state") == "failed":
            findings.append(
                Finding("lost", "dag run", f"{run['dag_run_id']} (dt={run_partition(run)}) failed")
            )

    versions, champion = version_states(args.mlflow_conn_id, args.model, args.metric, options)
    findings += check_versions(versions, registered)
    findings += check_champion(versions, champion, direction=args.direction, min_improvement=args.min_improvement,
                               promote_historical=args.promote_historical)  # fmt: skip

    jobs, pools = ray_state(args.ray_conn_id)
    for job in jobs:  # the tries of active jobs outside the audited runs too
        meta = job.get("metadata") or {}
        key = (
            meta.get("airflow_dag_id", ""),
            meta.get("airflow_run_id", ""),
            meta.get("airflow_task_id", ""),
        )
        if job.get("status") in ("PENDING", "RUNNING") and all(key) and key not in tries:
            tries[key] = api.task_state(*key) or ""
    findings += check_jobs(jobs, tries)
    findings += check_warm_pools(pools, jobs, now_s=time.time(), idle_s=args.warm_idle_s)

    texts = log_files(args.logs) | job_logs(args.ray_conn_id, jobs, args.dag)
    findings += find_secrets(texts, connection_secrets(args.secret_conn))
    faults = count_faults(Path(args.fault_log).read_text().splitlines()) if args.fault_log else {}
    return {
        "dates": dates,
        "runs": len(runs),
        "versions": len(versions),
        "champion": champion,
        "ray_jobs": len(jobs),
        "logs_read": len(texts),
        "faults": faults,
        "retries": retries,
        "totals": totals(findings),
        "findings": [asdict(f) for f in findings],
        "table": table(faults, retries, findings),
        "exit_code": exit_code(findings),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__.split("\n\n")[0])
    p.add_argument("--dag", default="retrain_tabular")
    p.add_argument("--model", default="tabular-mlp", help="the registered model the DAG promotes")
    p.add_argument("--metric", default="test_accuracy", help="the promotion's gate metric")
    p.add_argument("--direction", default="max", choices=("max", "min"))
    p.add_argument("--min-improvement", type=float, default=0.0)
    p.add_argument("--promote-historical", action="store_true")
    p.add_argument("--register-task", default="register")
    p.add_argument("--raw-uri", required=True, help="the raw dataset (dt=... partitions)")
    p.add_argument("--staged-uri", required=True, help="the dataset the DAG commits generations to")
    p.add_argument("--dates", required=True, help="FROM:TO (inclusive) or a comma-separated list")
    p.add_argument("--cos-conn-id", default="cos_default")
    p.add_argument("--ray-conn-id", default="ray_default")
    p.add_argument("--mlflow-conn-id", default="mlflow_default")
    p.add_argument("--airflow-url", required=True)
    p.add_argument("--airflow-user", default="admin")
    p.add_argument("--airflow-password", default=os.environ.get("AIRFLOW_AUDIT_PASSWORD"))
    p.add_argument("--airflow-token", default=os.environ.get("AIRFLOW_AUDIT_TOKEN"))
    p.add_argument("--logs", action="append", default=[], help="a folder of logs to search for secrets")
    p.add_argument("--secret-conn", action="append", default=None,
                   help="a connection whose secrets must appear in no log (default: cos, ray, mlflow)")  # fmt: skip
    p.add_argument("--fault-log", help="the chaos run's fault log (JSON lines with a kind)")
    p.add_argument("--idle-s", type=float, default=2 * 300.0,
                   help="an uncommitted generation untouched this long is abandoned (writers renew every 300 s)")  # fmt: skip
    p.add_argument("--warm-idle-s", type=float, default=600.0 + 30.0 + 60.0,
                   help="the warm pools' idle timeout plus their lease timeout, and a margin")  # fmt: skip
    p.add_argument("--json", help="also write the figures and findings here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.secret_conn is None:
        args.secret_conn = [args.cos_conn_id, args.ray_conn_id, args.mlflow_conn_id]
    result = audit(args)
    print(result["table"])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
