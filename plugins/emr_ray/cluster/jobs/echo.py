"""Job: return the spec's payload, optionally after a pause; a smoke test of the whole Jobs API path.

``fail_with`` fails it on its input (exit 2, not retried); ``crash_with`` fails it otherwise (exit 1).

Imports no Ray unless asked to spread tasks (``spread_tasks: N``): then it runs N one-CPU tasks
with the SPREAD strategy and reports the nodes they ran on, which shows placement across nodes.
``secret_probe: [NAME, ...]`` reports the sha256 of each named environment variable as the driver
and a Ray task of the job see it (never the value): how tests follow secrets through
:mod:`emr_ray.cluster.secrets`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any

from emr_ray.cluster.jobs._runtime import JobInputError, main

log = logging.getLogger("emr_ray.cluster.jobs.echo")


def run(spec: dict[str, Any]) -> dict[str, Any]:
    seconds = float(spec.get("sleep_seconds", 0))
    for second in range(int(seconds)):
        log.info("echo job waiting: %d/%d s", second + 1, int(seconds))
        time.sleep(1)
    if spec.get("fail_with"):
        raise JobInputError(spec["fail_with"])
    if spec.get("crash_with"):
        raise RuntimeError(spec["crash_with"])
    result: dict[str, Any] = {"echo": spec.get("payload")}
    if spec.get("spread_tasks"):
        result["task_nodes"] = _spread(int(spec["spread_tasks"]))
    if spec.get("secret_probe"):
        result["secret_digests"] = _probe(list(spec["secret_probe"]))
    return result


def _digests(names: list[str]) -> dict[str, str | None]:
    return {n: hashlib.sha256(os.environ[n].encode()).hexdigest() if n in os.environ else None for n in names}


def _probe(names: list[str]) -> dict[str, Any]:
    import ray

    from emr_ray.cluster import secrets

    ray.init(address="auto", logging_level=logging.WARNING, ignore_reinit_error=True)

    @ray.remote(num_cpus=0)
    def in_a_worker(handed: secrets.CopyName | None) -> dict[str, str | None]:
        secrets.ensure_env()  # unpickling ``handed`` told this process the copy's name
        return _digests(names)

    handed = secrets.carried()
    digests = {"driver": _digests(names), "worker": ray.get(in_a_worker.remote(handed))}
    return {
        **digests,
        "copy": hashlib.sha256(handed.key.encode()).hexdigest() if handed else None,
        "copy_by_name": _by_name(handed.key.partition("#")[0] if handed else None, names),
    }


def _by_name(name: str | None, names: list[str]) -> dict[str, bool]:
    """What a holder of the cluster's token reads under the copy's name alone (the name the GCS's
    debug log may print): whether it is there, and whether it holds any of the secrets in clear."""
    from ray.experimental import internal_kv

    raw = (internal_kv._internal_kv_get(name) if name else None) or b""
    values = [os.environ[n].encode() for n in names if os.environ.get(n)]
    return {"found": bool(raw), "holds_a_secret": any(value in raw for value in values)}


def _spread(count: int) -> list[str]:
    import ray

    ray.init(address="auto", logging_level=logging.WARNING, ignore_reinit_error=True)

    @ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
    def where() -> str:
        time.sleep(1)  # keep each task busy, so the scheduler has to use more than one node
        return ray.get_runtime_context().get_node_id()

    return ray.get([where.remote() for _ in range(count)])


if __name__ == "__main__":
    main(run, fast_exit=True)
