"""One call in a process of its own that ends with it: what a long-lived process must not keep (cluster side).

A warm group's rank 0 serves job after job (:mod:`emr_ray.cluster.jobs.train_group`). Scoring the
champion there would leave in it a model unpickled from the registry (its classes, its globals, any
state its code set up) and whatever the MLflow client cached with the job's login, for the next job
to run beside. So rank 0 runs that call here: in a child process that takes one request, runs it,
answers and exits. Nothing of the call outlives it.

The child is started ahead (:func:`prepare`: after each call, and when a run that will compare
begins) and imports torch and MLflow while rank 0 waits or trains, so a call pays for none of that
(2-3 s here); once it has answered it ends without the interpreter's teardown (0.7-0.8 s here). It
starts without any login in its environment: what a call needs comes with the request, through a
pipe, like its other arguments; never in an argument list or an environment another process can
read (the champion's scoring needs no login: rank 0 downloads its files). When rank 0 dies, the
child reads the end of its input and exits.

Runs on the cluster: never imports Airflow.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("emr_ray.cluster.jobs.clean_process")

#: imported by a child while it waits: what scoring a logged torch model needs. The last two are what
#: loading a ``torch.export`` program (the ``.pt2`` a logged model holds) imports on first use: 1.3 s
#: of a 1.5 s first load here, paid by every call otherwise, since each child serves one call.
PREIMPORTS = (
    "torch", "mlflow.pytorch", "mlflow.pyfunc", "pyarrow.parquet", "torch._dynamo", "torch._export.serde.serialize",
)  # fmt: skip
#: the longest one call may take before its child is killed
CALL_TIMEOUT_S = 900.0
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_ready: subprocess.Popen[bytes] | None = None
_lock = threading.Lock()


class CallFailed(RuntimeError):
    """The child died, timed out or raised something that cannot cross back as itself."""


def prepare() -> None:
    """Have a child ready for the next call (started now, it imports while this process waits)."""
    global _ready
    with _lock:
        if _ready is None or _ready.poll() is not None:
            _ready = _start()


def call(
    fn: str, kwargs: Mapping[str, Any], env: Mapping[str, str], timeout_s: float = CALL_TIMEOUT_S
) -> Any:
    """``fn`` (an import path) called with ``kwargs`` in a child with ``env`` set; its value, or its
    exception raised here. The child's log lines are logged here. A fresh child is prepared after."""
    global _ready
    with _lock:
        child = _ready if _ready is not None and _ready.poll() is None else _start()
        _ready = None
    request = pickle.dumps({"fn": fn, "kwargs": dict(kwargs), "env": dict(env)})
    try:
        answer, lines = child.communicate(request, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise CallFailed(
            f"{fn} did not finish in {timeout_s:.0f}s in its own process; it was killed"
        ) from None
    finally:
        prepare()
    for line in lines.decode(errors="replace").splitlines():
        if line.strip():
            log.info("[pid %d] %s", child.pid, line)
    log.info("%s ran in process %d, which has ended (exit code %s)", fn, child.pid, child.returncode)
    if child.returncode != 0 or not answer:
        raise CallFailed(f"{fn} ended its process with exit code {child.returncode} and no answer")
    try:
        outcome = pickle.loads(answer)
    except Exception as e:  # an exception whose class cannot be rebuilt from its arguments
        raise CallFailed(f"{fn}'s answer could not be read back: {type(e).__name__}: {e}") from e
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _start() -> subprocess.Popen[bytes]:
    """A child with this process's code path and working folder, and no MLflow login."""
    from emr_ray.cluster.mlflow_auth import CREDENTIAL_ENV_VARS

    env = {key: value for key, value in os.environ.items() if key not in CREDENTIAL_ENV_VARS}
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    return subprocess.Popen(
        [sys.executable, "-m", __name__],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=os.getcwd(),
    )  # fmt: skip


def _serve() -> None:
    """The child: import, read one request, run it, write the answer, exit."""
    import importlib

    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the call prints goes with its log lines, never into the answer
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT, stream=sys.stderr)
    for name in PREIMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not needed by every call; the call itself says what it lacks
            pass
    raw = sys.stdin.buffer.read()
    if not raw:
        return  # the parent died or never called: nothing to do
    request = pickle.loads(raw)
    os.environ.update(request["env"])
    try:
        from emr_ray.cluster.spec import import_by_path

        outcome: dict[str, Any] = {"value": import_by_path(request["fn"])(**request["kwargs"])}
    except Exception as e:
        outcome = {"error": e}
    try:
        payload = pickle.dumps(outcome)
    except Exception:  # an exception that does not pickle crosses back as its text
        payload = pickle.dumps(
            {"error": CallFailed(f"{type(outcome['error']).__name__}: {outcome['error']}")}
        )
    answer.write(payload)
    answer.flush()
    _exit_now()


def _exit_now() -> None:
    """End the child once it has answered, without tearing down torch and MLflow: the caller reads
    until the child's pipes close, so it would wait for that teardown."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _serve()
