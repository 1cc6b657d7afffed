"""How a job's secrets reach its processes without showing on the cluster's pages (cluster side).

A Ray job's ``runtime_env`` is public to anyone with the cluster's token: the Jobs API returns it,
the dashboard shows it, and the runtime-env agent writes it whole into its log when it creates the
environment. So secrets (COS keys, the MLflow login) never go there. Instead:

1. The operator uploads them as one small blob through the Jobs API's package endpoint under a
   random name (:mod:`emr_ray.hooks.ray_secrets`), and names only that reference in the job's
   environment (:data:`SECRET_REF_ENV`). The cluster drops the blob by itself if no job takes it
   (Ray's temporary reference on an uploaded package, 10 minutes by default; the operator renews
   it while the job waits in PENDING).
2. The job's driver takes it at start (:func:`take`): reads it, deletes it (single use), puts the
   values into its own environment, and keeps a job-scoped copy for the job's other processes under
   a random name it draws itself, so nothing public (the reference, the job's id) derives it. The
   copy is sealed with a one-time pad the driver draws too: the copy is pinned as a runtime-env URI,
   and the GCS prints its pinned URIs in its own debug log, so its name may be read there; what the
   name leads to is noise without the pad.
3. That name and its pad reach a worker process of the job (Ray Train workers and controller, Ray
   Data tasks) only inside what the driver sends it: every spec part, and :func:`carried` where no
   spec part goes, pickles them along and the worker adopts them when it unpickles them (never
   through a runtime_env, which the runtime-env agent logs). The worker calls :func:`ensure_env` before it
   reads a secret from its environment. The copy lives as long as the driver renews it (every
   minute, for :data:`COPY_TTL_SECONDS`) and is deleted when the driver exits, so a driver killed
   hard leaves nothing behind for long.

What a holder of the cluster's token can still do: run code on the cluster, and so read what a
running job holds in memory. What it cannot do: read a secret from the job info, the dashboard,
the cluster's logs, or after the job has ended.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets as random_tokens
import threading
from dataclasses import dataclass, field
from typing import Any

#: the environment variable that carries the reference to a job's staged secrets (not a secret)
SECRET_REF_ENV = "EMR_RAY_SECRETS_REF"
#: the package name prefix of staged secrets (``gcs://<prefix><random>.zip``)
STAGED_PREFIX = "_emr_ray_secrets_"
#: the package name prefix of a job-scoped copy (``gcs://<prefix><random>.zip``)
COPY_PREFIX = "_emr_ray_job_secrets_"
#: how long the job-scoped copy survives its driver (renewed every :data:`RENEW_SECONDS`)
COPY_TTL_SECONDS = 300
RENEW_SECONDS = 60

log = logging.getLogger("emr_ray.cluster.secrets")
_taken: dict[str, str] = {}
#: the job-scoped copies this process keeps (deleted when it ends: at exit, or by :func:`forget_all`)
_copies: list[str] = []
#: secret reference -> the name of its job-scoped copy, as this process knows it (drawn by the driver
#: in :func:`take`, adopted by a worker from what the driver sent it)
_copy_names: dict[str, str] = {}


class SecretsUnavailableError(RuntimeError):
    """The staged secrets are gone: taken by another process, or dropped by the cluster."""


@dataclass(frozen=True)
class CopyName:
    """The address of a job's secret copy (``<name>#<pad>``: its name and the one-time pad it is sealed
    with), as it travels to the job's other processes: unpickling it in a process makes the process
    know it (:func:`ensure_env` reads it there). Never printed."""

    ref: str
    key: str = field(repr=False)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (_adopt, (self.ref, self.key))


def _adopt(ref: str, key: str) -> CopyName:
    _copy_names.setdefault(ref, key)
    return CopyName(ref, key)


def carried() -> CopyName | None:
    """What a process of this job hands on so the receiver can read the job's secrets: put it in
    anything pickled to another process of the job that holds no spec part (a Ray Train callback).
    None outside a job with staged secrets (the Airflow side, a warm actor between calls)."""
    ref = os.environ.get(SECRET_REF_ENV)
    key = _copy_names.get(ref) if ref else None
    return CopyName(ref, key) if ref and key else None


def take() -> dict[str, str]:
    """In the job's driver, before anything else: fetch the staged secrets, delete them, export
    them to this process's environment and keep the job-scoped copy for the job's workers.

    Returns the names of what it exported (never the values). No reference: nothing to do.
    """
    ref = os.environ.get(SECRET_REF_ENV)
    if not ref:
        return {}
    if ref in _taken:
        return {name: "<set>" for name in json.loads(_taken[ref])}
    kv = _connect()
    blob = kv._internal_kv_get(ref)
    if blob is None:
        raise SecretsUnavailableError(
            f"The secrets staged for this job ({ref}) are gone: the cluster drops staged secrets "
            "that no job takes within its temporary-reference expiry (RAY_RUNTIME_ENV_TEMPORARY_"
            "REFERENCE_EXPIRATION_S, 600 s by default), or another process took them. Retry the task: "
            "each try stages its own."
        )
    kv._internal_kv_del(ref)
    _export(blob)
    key = f"gcs://{COPY_PREFIX}{random_tokens.token_hex(24)}.zip"
    sealed, pad = seal(blob)
    _copy_names[ref] = f"{key}#{pad}"
    kv._internal_kv_put(key, sealed)
    _renew(key)
    _copies.append(key)
    atexit.register(_forget, key)
    _taken[ref] = blob.decode()
    log.info("Took the job's secrets (%s); the staged copy is deleted", ", ".join(sorted(json.loads(blob))))
    return {name: "<set>" for name in json.loads(blob)}


def ensure_env() -> None:
    """In any process of the job: make sure the job's secrets are in this process's environment.

    A no-op outside a job that has staged secrets (the Airflow side, a job run by hand with its
    secrets in the environment) and once done. Needs a connected Ray worker (any task or actor) that
    was handed the copy's name: a spec part, or :func:`carried`, sent by the driver.
    """
    ref = os.environ.get(SECRET_REF_ENV)
    if not ref or ref in _taken:
        return
    import ray

    if not ray.is_initialized():
        return  # the driver before take(): take() is what exports them there
    from ray.experimental import internal_kv

    address = _copy_names.get(ref)
    if address is None:
        raise SecretsUnavailableError(
            "This process of the job was not handed the name of the job's secret copy: send it a spec "
            "part, or emr_ray.cluster.secrets.carried(), from the driver (the name never travels in a "
            "runtime_env)."
        )
    key, _, pad = address.partition("#")
    sealed = internal_kv._internal_kv_get(key)
    if sealed is None:
        raise SecretsUnavailableError(
            "This job's secrets are gone: its driver has exited or stopped renewing them. Retry the task."
        )
    blob = unseal(sealed, pad)
    _export(blob)
    _taken[ref] = blob.decode()


def seal(blob: bytes) -> tuple[bytes, str]:
    """``blob`` sealed with a one-time pad of its own length (drawn here, never reused), and the pad
    as hex: without the pad, the sealed bytes say nothing of the blob but its length."""
    pad = random_tokens.token_bytes(len(blob))
    return bytes(b ^ p for b, p in zip(blob, pad, strict=True)), pad.hex()


def unseal(sealed: bytes, pad: str) -> bytes:
    """What :func:`seal` sealed, with its pad."""
    key = bytes.fromhex(pad)
    if len(key) != len(sealed):
        raise SecretsUnavailableError("The job's secret copy does not match the pad this process was handed.")
    return bytes(b ^ p for b, p in zip(sealed, key, strict=True))


def _connect():  # noqa: ANN202 - ray's internal_kv module
    import ray
    from ray.experimental import internal_kv

    if not ray.is_initialized():
        ray.init(address="auto", logging_level=logging.WARNING)
    return internal_kv


def _export(blob: bytes) -> None:
    values = json.loads(blob)
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise SecretsUnavailableError("The staged secrets are not a JSON object of strings.")
    os.environ.update(values)


def _renew(key: str) -> None:
    """Pin the copy now and every :data:`RENEW_SECONDS` while this process lives (daemon thread)."""
    from ray.experimental import internal_kv

    internal_kv._pin_runtime_env_uri(key, expiration_s=COPY_TTL_SECONDS)

    def loop() -> None:
        stop = threading.Event()
        while not stop.wait(RENEW_SECONDS):
            try:
                internal_kv._pin_runtime_env_uri(key, expiration_s=COPY_TTL_SECONDS)
            except Exception as e:  # the driver is shutting down
                log.debug("Could not renew %s: %s", key, e)
                return

    threading.Thread(target=loop, name="emr-ray-secrets-renew", daemon=True).start()


def forget_all() -> None:
    """Delete this driver's job-scoped copies now: what the exit handler does, for a job that ends its
    process without the interpreter's exit handlers (``emr_ray.cluster.jobs._runtime``'s fast exit)."""
    while _copies:
        _forget(_copies.pop())


def _forget(key: str) -> None:
    try:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(key)
    except Exception as e:  # Ray already shut down: the pin lapses within COPY_TTL_SECONDS
        log.debug("Could not delete %s at exit: %s", key, e)
