"""The contract between the two sides: a small JSON job spec in, a small JSON result out.

The Airflow side encodes the spec into the job's entrypoint; the cluster side prints its result
(and, on failure, its error) as one marked line in the job log, which the operator reads back
through the Jobs API. That works on any cluster, with no shared filesystem between the sides.
Secrets never go into a spec: they travel in the job's runtime_env environment.
"""

from __future__ import annotations

import base64
import importlib
import json
from typing import Any

RESULT_MARKER = "EMR_RAY_RESULT "
ERROR_MARKER = "EMR_RAY_ERROR "
COS_SECRET_ENV = {"access_key": "EMR_RAY_COS_SECRET_ID", "secret_key": "EMR_RAY_COS_SECRET_KEY",
                  "session_token": "EMR_RAY_COS_TOKEN"}  # fmt: skip


def encode_spec(spec: dict[str, Any]) -> str:
    """URL-safe base64 of the JSON spec (fits in a shell command line without quoting)."""
    return base64.urlsafe_b64encode(json.dumps(spec, sort_keys=True).encode()).decode()


def decode_spec(text: str) -> dict[str, Any]:
    return json.loads(base64.urlsafe_b64decode(text.encode()).decode())


def entrypoint(module: str, spec: dict[str, Any], python: str = "python") -> str:
    """The Ray job entrypoint that runs ``module`` (a package job) with ``spec``."""
    return f"{python} -m {module} --spec-b64 {encode_spec(spec)}"


def parse_marked(logs: str, marker: str) -> dict[str, Any] | None:
    """The JSON after ``marker`` on the last log line that holds it, or None.

    The marker may follow other output on the same line (Spark's progress bar ends in a carriage
    return, not a newline), so it is searched for, not expected at the start.
    """
    for line in reversed(logs.splitlines()):
        at = line.rfind(marker)
        if at >= 0:
            return json.loads(line[at + len(marker) :])
    return None


def import_by_path(path: str) -> Any:
    """Import ``package.module:attribute`` (the form operators take for user code)."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{path!r} is not an import path like 'include.models.tabular:train_loop'.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"Cannot import {module_name!r} for {path!r} ({e}); the job's PYTHONPATH (runtime_env) "
            "must contain the project root that holds include/."
        ) from e
    try:
        return getattr(module, attribute)
    except AttributeError as e:
        raise ValueError(f"Module {module_name!r} has no {attribute!r} (from {path!r}).") from e
