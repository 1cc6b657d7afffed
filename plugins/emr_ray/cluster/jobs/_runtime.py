"""What every job entrypoint shares: read the spec, run, print the marked result or error, exit code.

Exit codes: 0 with the result line; 2 with an error line marked ``"input_error": true`` for what a
retry cannot fix (bad or missing input, a bad config or spec, a module that does not import); 1
with an error line and the traceback for anything else. The operator fails without retries on 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from emr_ray.cluster import mlflow_auth, secrets, storage
from emr_ray.cluster.jobs import _usage
from emr_ray.cluster.jobs._code import code_origin, explain_import_error, library_versions
from emr_ray.cluster.results import JobResult
from emr_ray.cluster.spec import ERROR_MARKER, RESULT_MARKER, SpecPart, decode_spec

log = logging.getLogger("emr_ray.cluster.jobs")


class JobInputError(Exception):
    """Bad input (missing partition, wrong schema, bad config): exit 2 with a message, no traceback."""


#: what a job raises for input a retry cannot fix (``ValueError`` covers spec decoding and checks)
INPUT_ERRORS: tuple[type[BaseException], ...] = (JobInputError, storage.StorageError, ValueError, ImportError)
INPUT_ERROR_EXIT_CODE = 2
#: the job log's line format
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def main(
    run: Callable[[Any], JobResult | dict[str, Any]],
    argv: list[str] | None = None,
    *,
    spec_type: type[SpecPart] | None = None,
    after: Callable[[Any, Any], None] | None = None,
    fast_exit: bool = False,
) -> None:
    """Decode the spec (into ``spec_type`` when given), run, print the marked result; exit 2 on bad input.

    A typed result (:mod:`emr_ray.cluster.results`) gets the code it ran and ``usage`` (what the job
    used: :mod:`emr_ray.cluster.jobs._usage`); a dict result (a job of your own) gets ``usage``. ``after(spec,
    result)`` then records the finished result where the job's results go (never fails the job).
    ``fast_exit`` (a job's own process): once the result is printed, end the process at once, without
    the interpreter's teardown of Ray, torch and MLflow (1-1.5 s of every job here).
    """
    _usage.start()
    parser = argparse.ArgumentParser()
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--spec-b64", help="the spec, as the operator encodes it")
    group.add_argument("--spec", help="a JSON spec file (for running a job by hand)")
    parser.add_argument("--result-file", help="also write the result JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stdout)
    try:
        if args.spec:
            with open(args.spec) as f:
                payload = json.load(f)
        else:
            payload = decode_spec(args.spec_b64)
        secrets.take()  # before anything reads a secret from the environment
        payload = mlflow_auth.with_secret_uris(payload)  # a database store's password, in memory only
        spec = spec_type.from_dict(payload) if spec_type else payload
        result = run(spec)
    except INPUT_ERRORS as e:  # a missing package: named, with the fix (emr_ray.cluster.jobs._code)
        # a disturbed write (storage.WriteConflictError) says a retry can succeed: a failure, not bad input
        _fail(explain_import_error(e), code=1 if getattr(e, "retryable", False) else INPUT_ERROR_EXIT_CODE)
    except Exception as e:
        traceback.print_exc(file=sys.stdout)
        refused = storage.refused_credentials(e)  # COS refusing the keys: no retry can fix it
        _fail(refused or e, code=INPUT_ERROR_EXIT_CODE if refused else 1)
    if isinstance(result, JobResult):  # the Spark and training jobs
        from emr_ray.cluster.reuse import code_version

        # with versions, the code version is what a model version's receipt names
        result = dataclasses.replace(
            result,
            code_origin=code_origin(),
            code_version=code_version(),
            versions=library_versions(),
            usage=_usage.report(),
        )
    elif isinstance(result, dict):
        result["usage"] = _usage.report().to_dict()  # never raises
    if isinstance(result, JobResult | dict) and after is not None:
        try:
            after(spec, result)
        except Exception as e:  # the result stands; only its record elsewhere is missing
            log.warning("Could not record the result (%s: %s)", type(e).__name__, e)
    plain = result.to_dict() if isinstance(result, JobResult) else result
    line = json.dumps(plain, sort_keys=True, default=str)
    if args.result_file:
        with open(args.result_file, "w") as f:
            f.write(line)
    sys.stderr.flush()
    print("\n" + RESULT_MARKER + line, flush=True)  # on a line of its own, whatever was printed before
    if fast_exit:
        secrets.forget_all()  # the one exit handler that must run: the job-scoped copy of its secrets
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)


def _fail(error: BaseException, *, code: int) -> None:
    sys.stderr.flush()
    marked = {
        "type": type(error).__name__,
        "message": str(error),
        "input_error": code == INPUT_ERROR_EXIT_CODE,
    }
    print("\n" + ERROR_MARKER + json.dumps(marked), flush=True)
    sys.stdout.flush()
    sys.exit(code)
