"""The reuse rule: an earlier try's Ray job is taken over only when it computes the same thing.

What a job computes from is its job module, the payload the operator submits, its runtime_env
(without secrets) and the provider's cluster-side code; :func:`spec_digest` is a sha256 of all four,
stored in the job's metadata at submit. A retry with the same digest reattaches (no second job); a
try whose inputs or code changed submits anew; ``force_recompute`` reuses nothing.
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
from emr_ray.spec import COS_SECRET_ENV

#: set (to 1) in a job's environment when the user forces recomputation
FORCE_ENV = "EMR_RAY_FORCE"
#: the job metadata key that holds the digest
DIGEST_KEY = "emr_ray_spec_digest"
_AIRFLOW_SIDE = frozenset({"hooks", "operators", "sensors", "triggers", "links"})
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSW|CREDENTIAL|PRIVATE|(^|_)KEY$|ACCESS_KEY", re.IGNORECASE)


@lru_cache(maxsize=1)
def code_version() -> str:
    """The provider version plus a hash of the package's cluster-side code (everything but the
    Airflow-side ``hooks``, ``operators``, ``sensors``, ``triggers`` and ``links``)."""
    root = Path(emr_ray.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in _AIRFLOW_SIDE:
            continue
        digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{emr_ray.__version__}+{digest.hexdigest()[:16]}"


def digestible_runtime_env(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime_env as the spec digest sees it: secret values and the force flag left out, so
    rotating a credential or forcing one run does not change what a job computes."""
    env = dict(runtime_env)
    if "env_vars" in env:
        secret = set(COS_SECRET_ENV.values())
        env["env_vars"] = {
            name: "<secret>" if name in secret or _SECRET_NAME.search(name) else value
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
