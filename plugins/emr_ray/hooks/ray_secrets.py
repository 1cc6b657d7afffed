"""Stage a job's secrets on the cluster, out of sight of its pages (Airflow side of :mod:`emr_ray.cluster.secrets`).

The secrets travel once, over the hook's authenticated (and, remotely, TLS) connection, as a small
blob put through the Jobs API's package endpoint under a random name; the job's environment names
only that reference. ``GET`` on the package is what Ray's own job client does after an upload: it
pins the package for the cluster's temporary-reference expiry (600 s by default), after which the
cluster deletes a blob that no job took. The wait loops renew that pin while a job is PENDING
(:func:`staged_ref_of`), so a job that waits for resources longer still finds its secrets.
"""

from __future__ import annotations

import json
import secrets as random_tokens
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from emr_ray.cluster.secrets import SECRET_REF_ENV, STAGED_PREFIX

if TYPE_CHECKING:
    from emr_ray.hooks.ray import RayHook

PACKAGES = "/api/packages/gcs/"


class LogsInfo(Protocol):
    """The task's logger, as far as staging uses it."""

    def info(self, event: Any, *args: Any, **kw: Any) -> Any: ...


def stage(hook: RayHook, values: Mapping[str, str]) -> str:
    """Upload ``values`` (env var name -> secret) for one job; returns the reference the job's
    environment carries (:data:`SECRET_REF_ENV`). Each call stages a new, single-use blob."""
    name = f"{STAGED_PREFIX}{random_tokens.token_hex(24)}.zip"
    body = json.dumps(dict(values), sort_keys=True).encode()
    hook.call_with_retries(
        "PUT <staged secrets>", lambda: hook._request_once("PUT", PACKAGES + name, content=body)
    )
    renew(hook, name)
    return f"gcs://{name}"


def stage_for_job(
    hook: RayHook, runtime_env: dict[str, Any], secrets: Mapping[str, str], log: LogsInfo
) -> tuple[dict[str, Any], set[str]]:
    """Stage a job's ``secrets`` and the runtime_env's secret-looking environment variables (the
    connection's and the task's: :func:`emr_ray.cluster.reuse.secret_looking`) as one blob; returns
    the runtime_env that names only its reference, and the variables moved out of it (the driver
    exports them; workers fetch them with the job's other secrets). Logs names, never values."""
    from emr_ray.cluster.reuse import FORCE_ENV, secret_looking
    from emr_ray.hooks.ray import merge_runtime_env

    merged = hook.job_runtime_env(runtime_env)
    moved = {
        name: str(value)
        for name, value in (merged.get("env_vars") or {}).items()
        if name not in (SECRET_REF_ENV, FORCE_ENV) and secret_looking(name)
    }
    if moved:
        log.info(
            "Moving %d secret-looking environment variable(s) of the runtime_env (%s) to the secret "
            "channel: the Jobs API and the dashboard show a runtime_env",
            len(moved),
            ", ".join(sorted(moved)),
        )
    values = {**moved, **secrets}
    if not values:
        return runtime_env, set()
    ref = stage(hook, values)
    log.info(
        "Staged %d secret(s) for the job (%s); none is in its runtime_env",
        len(values),
        ", ".join(sorted(values)),
    )
    return merge_runtime_env(runtime_env, {"env_vars": {SECRET_REF_ENV: ref}}), set(moved)


def renew(hook: RayHook, name: str) -> None:
    """Pin the staged blob for another expiry period (a 404 means the job took it already)."""
    hook._request("GET", PACKAGES + name, allow_404=True)


def staged_ref_of(job: Mapping[str, Any]) -> str | None:
    """The package name of a PENDING job's staged secrets (to renew them), else None."""
    if job.get("status") != "PENDING":
        return None
    runtime_env = job.get("runtime_env")
    env = (runtime_env.get("env_vars") or {}) if isinstance(runtime_env, dict) else {}
    ref = str(env.get(SECRET_REF_ENV) or "")
    name = ref.removeprefix("gcs://")
    return name if name.startswith(STAGED_PREFIX) else None
