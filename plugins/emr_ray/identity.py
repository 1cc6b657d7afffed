"""Deterministic names for everything remote, derived from (dag id, run id, task id, map index).

One rule gives reattach on retry (same Ray job submission id per try), resume from checkpoint
(same Ray Train run name and storage path across tries) and idempotent MLflow registration.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _slug(text: str, limit: int = 40) -> str:
    return _UNSAFE.sub("-", text).strip("-")[:limit] or "x"


@dataclass(frozen=True)
class TaskIdentity:
    """Who is asking: the Airflow task instance a remote object belongs to."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    try_number: int = 1

    @classmethod
    def from_context(cls, context: Any) -> TaskIdentity:
        ti = context["ti"]
        return cls(
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            map_index=int(getattr(ti, "map_index", -1) if getattr(ti, "map_index", None) is not None else -1),
            try_number=int(getattr(ti, "try_number", 1) or 1),
        )

    @property
    def digest(self) -> str:
        """A short stable hash of the task instance (not the try)."""
        key = f"{self.dag_id}\x00{self.run_id}\x00{self.task_id}\x00{self.map_index}"
        return hashlib.sha256(key.encode()).hexdigest()[:10]

    @property
    def run_name(self) -> str:
        """Ray Train run name: the same on every try, so a retry resumes from the checkpoint."""
        suffix = "" if self.map_index < 0 else f"-m{self.map_index}"
        return f"{_slug(self.dag_id, 30)}-{_slug(self.task_id, 30)}{suffix}-{self.digest}"

    def submission_id(self) -> str:
        """Ray job submission id: stable per try, so a restarted worker reattaches instead of resubmitting."""
        return f"airflow-{self.run_name}-t{self.try_number}"

    def checkpoint_path(self, root: str) -> str:
        """``<root>/checkpoints/<dag_id>/<run_id>/<task_id>`` (map index appended when mapped)."""
        task = self.task_id if self.map_index < 0 else f"{self.task_id}/{self.map_index}"
        return f"{root.rstrip('/')}/checkpoints/{_slug(self.dag_id, 200)}/{_slug(self.run_id, 200)}/{task}"

    def tags(self) -> dict[str, str]:
        """Tags for MLflow runs and model versions."""
        return {
            "airflow.dag_id": self.dag_id,
            "airflow.run_id": self.run_id,
            "airflow.task_id": self.task_id,
            "airflow.map_index": str(self.map_index),
        }


def tenant_of(connections: Mapping[str, str | None]) -> str:
    """Whose warm pools a job may use: a digest of what its connections (kind -> connection id) point
    at, never their secrets (:func:`connection_identity`), so two deployments whose same connection
    ids name other accounts never share a pool."""
    pointed = {kind: connection_identity(conn_id) for kind, conn_id in connections.items()}
    return hashlib.sha256(json.dumps(pointed, sort_keys=True, default=str).encode()).hexdigest()[:16]


def connection_identity(conn_id: str | None) -> dict[str, Any]:
    """What a connection points at, without its secrets: its id, host, port, schema, login and the
    extras whose names do not look secret (:func:`emr_ray.cluster.reuse.secret_looking`)."""
    if not conn_id:
        return {}
    from airflow.sdk import BaseHook

    from emr_ray.cluster.reuse import secret_looking

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # not defined here (a test, a connection only some DAGs use): its id decides
        return {"id": conn_id}
    extra = {k: v for k, v in (conn.extra_dejson or {}).items() if not secret_looking(str(k))}
    return {
        "id": conn_id,
        "type": conn.conn_type,
        "host": conn.host,
        "port": conn.port,
        "schema": conn.schema,
        "login": conn.login,
        "extra": extra,
    }
