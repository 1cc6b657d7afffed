"""The audit: did a DAG's runs lose, duplicate, orphan or leak anything? Read-only (a read-only credential
will do: nothing is written, no probe, no tag); runs against a real deployment as against the local
stack, through the same Airflow connections the DAGs use::

    python -m emr_ray.audit --dag retrain_tabular --model tabular-mlp \\
        --raw-uri cos://bucket/raw --staged-uri cos://bucket/staging/tabular --dates 2026-10-01:2026-10-30 \\
        --airflow-url https://airflow.example --airflow-user auditor --logs /opt/airflow/logs

For every date: exactly one current generation whose rows equal the raw partition's (footers of the
files its manifest lists, and the rows it read); no generation left uncommitted by a writer that is
gone (``--idle-s``). Every model version names a committed generation and the MLflow run that made
it, one version per Airflow run; every version the retention policy keeps (``--keep-versions``,
``--keep-version-days``, alias holders) has its generation whole: each file its manifest lists is
there with its size and the rows its footers hold are the rows the manifest declares. The champion is
the version the promotion rule picks, replayed in registration order (a champion a person moved by
hand fails this line, as it should be explained). No Ray job PENDING or RUNNING without a live Airflow
try, nor an earlier try's job beside a later try's own (the Jobs API's ``airflow_*`` metadata, the REST
API's task instances); no warm pool alive past ``--warm-idle-s`` after the last job; no secret of the
connections (``--secret-conn``) in any log or record: the files under ``--logs``, the driver logs of
the DAG's Ray jobs, the Jobs API's job list, each job's decoded spec, and the cluster's own session
logs on every node (the dashboard's log API; ``--no-cluster-logs`` skips them).

It prints a table (faults by kind from ``--fault-log``, retries, then lost, duplicated, orphaned,
misdecided, leaked) and exits 1 unless each of those is 0. The rules are :mod:`emr_ray.audit.rules`,
what is read :mod:`emr_ray.audit.sources`. Nothing is written, except the JSON of ``--json``. Ages are
taken with this machine's clock.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from emr_ray.audit import sources
from emr_ray.audit.rules import (
    Finding,
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
from emr_ray.cluster.model_retention import DEFAULT_KEEP_DAYS, DEFAULT_KEEP_NEWEST, VersionPolicy


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

    policy = VersionPolicy(args.keep_versions, args.keep_version_days)
    uris = (args.raw_uri, args.staged_uri)
    options = storage_options(args.cos_conn_id) if any(u.startswith("cos://") for u in uris) else None
    dates = parse_dates(args.dates)
    now = time.time()
    findings: list[Finding] = []
    for date in dates:
        findings += check_partition(
            sources.partition_state(args.raw_uri, args.staged_uri, date, options, now), idle_s=args.idle_s
        )

    api = sources.AirflowApi(
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

    versions, champion = sources.version_states(args.mlflow_conn_id, args.model, args.metric, options, policy)
    findings += check_versions(versions, registered)
    findings += check_champion(
        versions,
        champion,
        direction=args.direction,
        min_improvement=args.min_improvement,
        promote_historical=args.promote_historical,
    )

    jobs, pools = sources.ray_state(args.ray_conn_id)
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

    texts = sources.log_files(args.logs) | sources.job_logs(args.ray_conn_id, jobs, args.dag)
    texts |= sources.job_records(jobs)
    if args.cluster_logs:
        texts |= sources.cluster_logs(args.ray_conn_id)
    findings += find_secrets(texts, sources.connection_secrets(args.secret_conn))
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
    p = argparse.ArgumentParser(prog="python -m emr_ray.audit", description=__doc__.split("\n\n")[0])
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
    p.add_argument(
        "--secret-conn",
        action="append",
        default=None,
        help="a connection whose secrets must appear in no log (default: cos, ray, mlflow)",
    )
    p.add_argument("--fault-log", help="the chaos run's fault log (JSON lines with a kind)")
    p.add_argument(
        "--idle-s",
        type=float,
        default=2 * 300.0,
        help="an uncommitted generation untouched this long is abandoned (writers renew every 300 s)",
    )
    p.add_argument(
        "--warm-idle-s",
        type=float,
        default=600.0 + 30.0 + 60.0,
        help="the warm pools' idle timeout plus their lease timeout, and a margin",
    )
    p.add_argument(
        "--keep-versions",
        type=int,
        default=DEFAULT_KEEP_NEWEST,
        help="the housekeeping's policy: newest versions of the model whose data must be whole",
    )
    p.add_argument(
        "--keep-version-days",
        type=float,
        default=DEFAULT_KEEP_DAYS,
        help="the housekeeping's policy: days a version's data must stay whole after registration",
    )
    p.add_argument(
        "--no-cluster-logs",
        dest="cluster_logs",
        action="store_false",
        help="skip the cluster's session logs (read through the dashboard's log API)",
    )
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
