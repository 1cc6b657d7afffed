"""What the audit reads, read-only: Airflow's REST API, the store, the registry, the cluster, the logs.

Nothing here writes (no probe, no tag, no pin), so the audit runs with a read-only credential. The rules
that judge what is read are :mod:`emr_ray.audit.rules`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from emr_ray.audit.rules import PartitionState, VersionState

#: the warm pools' Ray namespaces (``emr_ray.cluster.warm.keys.POOLS``)
WARM_NAMESPACES = ("emr_ray_spark_sessions", "emr_ray_train_groups")
#: bytes read from each log file (the end of a longer one)
LOG_BYTES = 4 << 20
#: lines read from the end of each of the cluster's session log files
CLUSTER_LOG_LINES = 20000


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
def generation_problem(data_uri: str, generation: str, options: Any) -> str | None:
    """Why the generation is not whole (None: it is): every file its manifest lists is there with its
    size, and the rows the files' footers hold are the rows the manifest declares for each output."""
    from emr_ray.cluster import partitions, storage

    opts = options if data_uri.startswith("cos://") else None
    try:
        committed = partitions.pinned(data_uri, generation, opts)
    except (storage.StorageError, OSError) as e:
        return f"not committed ({e})"
    fsys = storage.filesystem(data_uri, opts)
    for name, entry in sorted(committed.outputs.items()):
        try:
            rows = _parquet_rows(fsys, [p for p, _ in partitions.dataset_files(committed, name, opts)])
        except (storage.StorageError, OSError) as e:
            return f"output {name}: {e}"
        declared = entry.get("rows")
        if declared is not None and int(declared) != rows:
            return f"output {name} holds {rows} rows, its manifest declares {declared}"
    return None


def version_states(
    mlflow_conn_id: str, model: str, metric: str, options: Any, policy: Any = None
) -> tuple[list[VersionState], str | None]:
    """Every version of ``model`` with what it names, whether the retention ``policy``
    (:class:`~emr_ray.cluster.model_retention.VersionPolicy`) keeps its data and, if so, whether that
    data is whole; and the version the champion alias points at."""
    import datetime as dt

    from emr_ray.cluster.model_retention import VersionPolicy
    from emr_ray.cluster.promotion import comparison_from_run
    from emr_ray.hooks.mlflow import MLflowHook

    policy = policy or VersionPolicy()
    hook = MLflowHook(mlflow_conn_id)
    facts = {f.version: f for f in hook.version_facts(model)}
    now = dt.datetime.now(dt.UTC)
    states = []
    for v in hook.live_versions(model):
        tags = v.tags or {}
        data_uri, generation = tags.get("data_uri"), tags.get("generation")
        fact = facts.get(str(v.version))
        kept = fact is None or policy.why_kept(fact, now) is not None
        problem = generation_problem(data_uri, generation, options) if data_uri and generation else None
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
                generation_committed=problem is None or not problem.startswith("not committed"),
                run_found=run is not None,
                run_matches=matches,
                value=metrics.get(metric),
                partition=tags.get("partition"),
                comparison=comparison_from_run(run_tags, metrics, model_name=model, metric=metric)
                if run
                else None,
                kept=kept,
                data_problem=problem,
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


def job_records(jobs: Iterable[dict]) -> dict[str, str]:
    """What the Jobs API shows of each job, as text to search: its JSON (entrypoint, metadata,
    runtime_env, message) and every base64 argument of its entrypoint decoded (the spec travels so)."""
    texts = {}
    for job in jobs:
        name = f"ray job {job.get('submission_id') or job.get('job_id')}"
        texts[f"{name} (Jobs API record)"] = json.dumps(job, sort_keys=True, default=str)
        decoded = [
            _b64(token) for token in re.findall(r"[A-Za-z0-9+/_=-]{24,}", str(job.get("entrypoint") or ""))
        ]
        if any(decoded):
            texts[f"{name} (decoded entrypoint)"] = "\n".join(d for d in decoded if d)
    return texts


def cluster_logs(ray_conn_id: str, lines: int = CLUSTER_LOG_LINES) -> dict[str, str]:
    """The end of every log file of the cluster's session on every node (the dashboard's log API)."""
    from emr_ray.hooks.ray import RayHook

    hook = RayHook(ray_conn_id)
    nodes = hook.check_response(hook.client.get("/api/v0/nodes?limit=10000&detail=true"))
    assert nodes is not None
    texts = {}
    for node in nodes.json().get("data", {}).get("result", {}).get("result", []):
        node_id = node.get("node_id")
        if not node_id or node.get("state") != "ALIVE":
            continue
        listed = hook.check_response(hook.client.get(f"/api/v0/logs?node_id={node_id}"))
        assert listed is not None
        for names in (listed.json().get("data", {}).get("result") or {}).values():
            for name in names:
                query = urllib.parse.urlencode({"node_id": node_id, "filename": name, "lines": lines})
                try:
                    answer = hook.client.get(f"/api/v0/logs/file?{query}")
                    texts[f"cluster log {node_id[:8]}:{name}"] = (
                        answer.text if answer.status_code == 200 else ""
                    )
                except Exception as e:  # a file rotated away between the listing and the read
                    texts[f"cluster log {node_id[:8]}:{name}"] = f"(unreadable: {type(e).__name__})"
    return texts


def _b64(token: str) -> str:
    """``token`` decoded as base64 text (URL-safe or standard), or empty when it is not."""
    try:
        return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return ""
