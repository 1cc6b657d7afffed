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
from typing import TYPE_CHECKING, Any

from emr_ray.cluster.secrets import SECRET_REF_ENV, STAGED_PREFIX

if TYPE_CHECKING:
    from emr_ray.hooks.ray import RayHook

PACKAGES = "/api/packages/gcs/"


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
