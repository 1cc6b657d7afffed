"""What names a warm pool: a hash of everything that shapes it (its settings, the job's runtime_env
less what is one job's alone, the code the cluster imports, the tenant), so jobs with the same
configuration share a pool and any difference gets another. A configuration's replicas are
``<key>-0``, ``<key>-1``..."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from emr_ray.cluster.reuse import FORCE_ENV
from emr_ray.cluster.secrets import SECRET_REF_ENV

#: the Ray namespace of each kind of warm pool, with the prefix of its actors' names
POOLS: dict[str, str] = {"emr_ray_spark_sessions": "spark-", "emr_ray_train_groups": "train-"}
#: the environment variables a job's runtime_env has that are this job's alone (secret reference,
#: forced recompute): not part of a pool's configuration, never given to a pool
PER_JOB_ENV = frozenset({SECRET_REF_ENV, FORCE_ENV})


def pool_runtime_env(job_runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """The job's runtime_env without what is this job's alone (its secret reference, its flags)."""
    env = {k: v for k, v in dict(job_runtime_env).items() if k not in ("config", "_ray_commit")}
    env_vars = {k: v for k, v in dict(env.get("env_vars") or {}).items() if k not in PER_JOB_ENV}
    if env_vars:
        env["env_vars"] = env_vars
    else:
        env.pop("env_vars", None)
    return env


def code_identity(import_paths: Iterable[str]) -> str:
    """What a pool's processes import, as this cluster has it: the provider's cluster side and every
    ``.py`` file of the top-level packages the job's code lives in (``include`` for
    ``include.preprocessing.tabular:standardize``). Part of every pool's key, so a module fixed and
    deployed in place gets a new pool at the next job: a busy pool (a backfill never lets it idle)
    never keeps running the old code."""
    import importlib.util
    from pathlib import Path

    from emr_ray.cluster.reuse import code_version

    digest = hashlib.sha256(code_version().encode())
    for top in sorted({path.split(":")[0].split(".")[0] for path in import_paths if path}):
        found = importlib.util.find_spec(top)
        roots = list(found.submodule_search_locations or []) if found else []
        files = [Path(found.origin)] if found and found.origin and not roots else []
        for root in roots:
            files += sorted(p for p in Path(root).rglob("*.py") if "__pycache__" not in p.parts)
        digest.update(f"\0{top}:{len(files)}".encode())
        for path in files:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def pool_key(prefix: str, payload: Mapping[str, Any]) -> str:
    """A pool's configuration key (its replicas are ``<key>-<i>``): equal configuration (and Python),
    equal key; any difference, another."""
    text = json.dumps({**payload, "python": sys.version}, sort_keys=True, default=str)
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:20]


def replica_index(name: str, key: str) -> int | None:
    """The replica number of ``name`` if it is a replica of ``key``, else None."""
    tail = name[len(key) + 1 :] if name.startswith(key + "-") else ""
    return int(tail) if tail.isdigit() else None


def first_free_replica(key: str, live: Iterable[str]) -> str:
    """The name of the lowest-numbered replica of ``key`` that is not live."""
    taken = {replica_index(name, key) for name in live}
    return f"{key}-{min(set(range(len(taken) + 1)) - taken)}"
