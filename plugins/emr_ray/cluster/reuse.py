"""The reuse rule: an earlier try's Ray job is taken over only when it computes the same thing.

What a job computes from is its job module, the payload the operator submits, its runtime_env
(without secrets) and the provider's cluster-side code; :func:`spec_digest` is a sha256 of all four,
stored in the job's metadata at submit. What it reads from outside its spec (a raw partition that
its producer may land again under the same URI) is recorded beside it as its **external inputs**:
a small map of name to identity (a listing's sizes, ETags and times; never the data, never a
secret), and :func:`external_changes` says which of them changed since. A retry with the same digest
and the same external inputs reattaches (no second job); a try whose inputs, code or external
inputs changed submits anew; ``force_recompute`` reuses nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import emr_ray
from emr_ray.cluster.spec import COS_SECRET_ENV

#: set (to 1) in a job's environment when the user forces recomputation
FORCE_ENV = "EMR_RAY_FORCE"
#: the job metadata key that holds the digest
DIGEST_KEY = "emr_ray_spec_digest"
#: the job metadata key that holds its external inputs (JSON: name -> identity)
EXTERNAL_KEY = "emr_ray_external_inputs"
#: how an identity starts when it could not be read: never equal to anything, so never reused
UNREADABLE = "unreadable: "
#: what never counts as code (the same patterns the package upload leaves out)
_NOT_CODE = ("__pycache__", ".pyc", ".pyo")
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSW|CREDENTIAL|PRIVATE|(^|_)KEY$|ACCESS_KEY", re.IGNORECASE)


def secret_looking(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret (``*_SECRET*``, ``*TOKEN*``,
    ``*PASSW*``, ``*_KEY``...): such values never travel in a runtime_env (the Jobs API shows it)."""
    return name in COS_SECRET_ENV.values() or bool(_SECRET_NAME.search(name))


#: the most characters of one value a record (an MLflow param or tag) keeps
RECORD_LIMIT = 500


def record_value(name: str, value: object, limit: int = RECORD_LIMIT) -> str:
    """What a record (an MLflow param or tag) may hold of ``value``: ``<secret>`` when ``name`` looks
    secret (:func:`secret_looking`, the environment's rule), else its text cut to ``limit`` characters."""
    if secret_looking(name):
        return "<secret>"
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cluster_side_files() -> list[tuple[str, Path]]:
    """The provider's cluster side, the one boundary between the sides: ``emr_ray/__init__.py`` and
    every file under ``emr_ray/cluster/``, as (name inside the package, path), sorted by name.

    The package upload ships exactly these (:func:`emr_ray.hooks.ray_packages.provider_package`)
    and :func:`code_version` hashes exactly these, so an Airflow-side edit (a Param's description,
    an operator's log line) neither ships nor changes a job's digest.
    """
    package = Path(emr_ray.__file__).parent
    files = [package / "__init__.py", *(path for path in (package / "cluster").rglob("*") if path.is_file())]
    return sorted(
        (path.relative_to(package).as_posix(), path)
        for path in files
        if not any(part == _NOT_CODE[0] for part in path.parts) and path.suffix not in _NOT_CODE[1:]
    )


@lru_cache(maxsize=1)
def code_version() -> str:
    """The provider version plus a hash of the package's cluster side (:func:`cluster_side_files`)."""
    digest = hashlib.sha256()
    for name, path in cluster_side_files():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{emr_ray.__version__}+{digest.hexdigest()[:16]}"


def digestible_runtime_env(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime_env as the spec digest sees it: secret values and the force flag left out, so
    rotating a credential or forcing one run does not change what a job computes."""
    env = dict(runtime_env)
    if "env_vars" in env:
        env["env_vars"] = {
            name: "<secret>" if secret_looking(name) else value
            for name, value in (env["env_vars"] or {}).items()
            if name != FORCE_ENV
        }
    return env


def spec_digest(
    job_module: str, payload: Mapping[str, Any], runtime_env: Mapping[str, Any], code: str
) -> str:
    """sha256 of the canonical JSON of what a job computes from: the job module, the payload the
    operator submits, its runtime_env (see :func:`digestible_runtime_env`) and the code version.
    An earlier try's job is reused only when its digest equals this try's."""
    canonical = json.dumps(
        {
            "job_module": job_module,
            "payload": payload,
            "runtime_env": digestible_runtime_env(runtime_env),
            "code": code,
        },
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode_external(inputs: Mapping[str, str]) -> str:
    """The external inputs as a job metadata value (the Jobs API keeps string values only)."""
    return json.dumps(dict(inputs), sort_keys=True, separators=(",", ":"))


def external_changes(recorded: str | None, current: Mapping[str, str]) -> list[str]:
    """What changed outside the spec since an earlier try's job was submitted: one line per external
    input whose identity differs from the one recorded in the job's metadata (``recorded``, as
    :func:`encode_external` wrote it), empty when nothing did. An input that could not be read, on
    either side, counts as changed: a job is reused only on evidence that it read the same thing.

    :param recorded: the job's metadata value under :data:`EXTERNAL_KEY` (None when absent).
    :param current: this try's external inputs, name -> identity.
    """
    if not current and not recorded:
        return []
    try:
        before = json.loads(recorded) if recorded else None
    except ValueError:
        before = None
    if not isinstance(before, dict):
        return [
            f"its external inputs were not recorded ({', '.join(sorted(current))} may have changed since)"
        ]
    changes = []
    for name in sorted(set(before) | set(current)):
        then, now = before.get(name), current.get(name)
        if now is None:
            changes.append(f"it read {name}, which this try does not")
        elif then is None:
            changes.append(f"it did not read {name}, which this try does")
        elif then.startswith(UNREADABLE) or now.startswith(UNREADABLE):
            changes.append(f"{name} could not be compared (then: {then}; now: {now})")
        elif then != now:
            changes.append(f"{name} changed since (then: {then}; now: {now})")
    return changes
