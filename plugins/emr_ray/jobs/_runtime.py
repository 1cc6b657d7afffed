"""What every job entrypoint shares: read the spec, run, print the marked result or error, exit code."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from emr_ray import storage
from emr_ray.spec import COS_SECRET_ENV, ERROR_MARKER, RESULT_MARKER, decode_spec

log = logging.getLogger("emr_ray.jobs")


class JobInputError(Exception):
    """Bad input (missing partition, wrong schema, bad config): exit 2 with a message, no traceback."""


def storage_options(spec: dict[str, Any]) -> storage.StorageOptions:
    """Storage settings: the public parts from the spec (``storage.cos``, ``storage.hdfs``, neither
    secret), the COS secrets from the job's environment (they never travel in a spec)."""
    sections: dict[str, Any] = spec.get("storage") or {}
    settings: dict[str, Any] = {**(sections.get("cos") or {})}
    settings.update({k: v for k, v in (sections.get("hdfs") or {}).items() if v is not None})
    settings.update({key: os.environ.get(env) for key, env in COS_SECRET_ENV.items()})
    return storage.StorageOptions(**settings)


def main(run: Callable[[dict[str, Any]], dict[str, Any]], argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--spec-b64", help="the spec, as the operator encodes it")
    group.add_argument("--spec", help="a JSON spec file (for running a job by hand)")
    parser.add_argument("--result-file", help="also write the result JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout
    )
    if args.spec:
        with open(args.spec) as f:
            spec = json.load(f)
    else:
        spec = decode_spec(args.spec_b64)
    try:
        result = run(spec)
    except (JobInputError, storage.StorageError, ValueError) as e:
        _fail(e, code=2)
    except Exception as e:
        traceback.print_exc(file=sys.stdout)
        _fail(e, code=1)
    line = json.dumps(result, sort_keys=True, default=str)
    if args.result_file:
        with open(args.result_file, "w") as f:
            f.write(line)
    sys.stderr.flush()
    print("\n" + RESULT_MARKER + line, flush=True)  # on a line of its own, whatever was printed before


def _fail(error: BaseException, *, code: int) -> None:
    sys.stderr.flush()
    print("\n" + ERROR_MARKER + json.dumps({"type": type(error).__name__, "message": str(error)}), flush=True)
    sys.stdout.flush()
    sys.exit(code)
