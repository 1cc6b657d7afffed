"""Job: return the spec's payload, optionally after a pause; a smoke test of the whole Jobs API path.

Imports no Ray: it checks submission, runtime_env, logs and result parsing in a second or two.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from emr_ray.jobs._runtime import JobInputError, main

log = logging.getLogger("emr_ray.jobs.echo")


def run(spec: dict[str, Any]) -> dict[str, Any]:
    seconds = float(spec.get("sleep_seconds", 0))
    for second in range(int(seconds)):
        log.info("echo job waiting: %d/%d s", second + 1, int(seconds))
        time.sleep(1)
    if spec.get("fail_with"):
        raise JobInputError(spec["fail_with"])
    return {"echo": spec.get("payload")}


if __name__ == "__main__":
    main(run)
