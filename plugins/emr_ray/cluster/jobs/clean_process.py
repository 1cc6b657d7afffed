"""One call in a process of its own that ends with it: what a long-lived process must not keep (cluster side).

A warm group's rank 0 serves job after job (:mod:`emr_ray.cluster.jobs.train_group`). Scoring the
champion there would leave in it a model unpickled from the registry (its classes, its globals, any
state its code set up) and whatever the MLflow client cached with the job's login, for the next job
to run beside. So rank 0 runs that call here: in a child process that takes one request, runs it,
answers and exits. Nothing of the call outlives it.

The children are forked from a template process (started ahead by :func:`prepare`, when a run that
will compare begins) that imports torch and MLflow once, while rank 0 trains, and never sees a
request: for each call it forks a child that takes the call's own pipes, reads the request, runs it,
answers and ends at once, without the interpreter's teardown. A fork costs milliseconds; a child
started for each call paid 3.1-3.3 CPU-s of imports per call (``bench/clean_process.py``). The
template starts without any login in its environment: what a call needs comes with the request,
through a pipe, like its other arguments; never in an argument list or an environment another
process can read (the champion's scoring needs no login: rank 0 downloads its files). When rank 0
dies, the template reads the end of its socket and exits.

What runs in the child may be hostile (a registered model is code): its answer comes back as JSON,
never unpickled here, and an exception only as its type's name and message (rebuilt as one of the
types the caller names, else :class:`CallFailed`). The child leads a process group of its own, killed
whole when the call ends, so nothing it started (DataLoader workers, a hung grandchild) outlives it,
and the template's environment holds no secret-looking variable.

Runs on the cluster: never imports Airflow.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("emr_ray.cluster.jobs.clean_process")

#: imported by the template once, before its first fork: what scoring a logged torch model needs. The last two are what
#: loading a ``torch.export`` program (the ``.pt2`` a logged model holds) imports on first use: 1.3 s
#: of a 1.5 s first load here, paid by every call otherwise, since each child serves one call.
PREIMPORTS = (
    "torch",
    "mlflow.pytorch",
    "mlflow.pyfunc",
    "pyarrow.parquet",
    "torch._dynamo",
    "torch._export.serde.serialize",
)
#: the longest one call may take before its child is killed
CALL_TIMEOUT_S = 900.0
#: how long a call's child may take to disappear once it has closed its pipes
GONE_TIMEOUT_S = 5.0
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_template: _Template | None = None
_lock = threading.Lock()


class CallFailed(RuntimeError):
    """The child died, timed out or raised something that cannot cross back as itself."""


class _Template:
    """The process each call's child is forked from, over a Unix socket pair: it receives a call's three
    pipe ends, forks, and answers with the child's pid."""

    def __init__(self) -> None:
        from emr_ray.cluster.mlflow_auth import CREDENTIAL_ENV_VARS
        from emr_ray.cluster.reuse import secret_looking

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in CREDENTIAL_ENV_VARS and not secret_looking(key)
        }
        env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno()), *PREIMPORTS],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            cwd=os.getcwd(),
        )
        theirs.close()
        self.socket = ours

    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, stdin: int, stdout: int, stderr: int) -> int:
        """A child forked with these three descriptors as its 0, 1 and 2; its pid."""
        socket.send_fds(self.socket, [b"f"], [stdin, stdout, stderr])
        pid = b""
        while len(pid) < 8:
            chunk = self.socket.recv(8 - len(pid))
            if not chunk:
                raise ConnectionError("the template process ended")
            pid += chunk
        return int.from_bytes(pid, "big")

    def stop(self) -> None:
        """End it at once: it holds nothing to save (a call's child is not its to wait for)."""
        self.socket.close()
        self.process.kill()
        self.process.wait()


def prepare() -> None:
    """Have the template ready for the next call (started now, it imports while this process waits)."""
    with _lock:
        _ready_template()


def _ready_template() -> _Template:
    global _template
    if _template is None or not _template.alive():
        _template = _Template()
    return _template


def _drop_template() -> None:
    global _template
    if _template is not None:
        _template.stop()
        _template = None


def call(
    fn: str,
    kwargs: Mapping[str, Any],
    env: Mapping[str, str],
    timeout_s: float = CALL_TIMEOUT_S,
    errors: Mapping[str, type[Exception]] | None = None,
) -> Any:
    """``fn`` (an import path) called with ``kwargs`` in a child with ``env`` set; its value (JSON), or
    its exception raised here: as the class ``errors`` maps its type's name to (built from its message),
    else :class:`CallFailed`. The child's log lines are logged here; it, and every process it started,
    has ended when this returns."""
    request = pickle.dumps({"fn": fn, "kwargs": dict(kwargs), "env": dict(env)})
    request_r, request_w = os.pipe()
    answer_r, answer_w = os.pipe()
    lines_r, lines_w = os.pipe()
    started = time.monotonic()
    try:
        with _lock:
            try:
                pid = _ready_template().fork(request_r, answer_w, lines_w)
            except OSError:  # the template died since the last call: once more with a new one
                _drop_template()
                pid = _ready_template().fork(request_r, answer_w, lines_w)
    except BaseException:
        for fd in (request_w, answer_r, lines_r):
            os.close(fd)
        raise
    finally:
        for fd in (request_r, answer_w, lines_w):
            os.close(fd)
    answer, lines, timed_out = _exchange(request, request_w, answer_r, lines_r, pid, timeout_s)
    for line in lines.decode(errors="replace").splitlines():
        if line.strip():
            log.info("[pid %d] %s", pid, line)
    if timed_out:
        raise CallFailed(f"{fn} did not finish in {timeout_s:.0f}s in its own process; it was killed")
    log.info("%s ran in process %d, which has ended (%.1fs)", fn, pid, time.monotonic() - started)
    if not answer:
        raise CallFailed(f"{fn} ended its process with no answer")
    try:
        outcome = json.loads(answer)
    except ValueError as e:  # never unpickled: what the child says is data, whatever ran there
        raise CallFailed(f"{fn}'s answer is not JSON ({e})") from None
    if not isinstance(outcome, dict) or not ({"value"} <= set(outcome) or {"error"} <= set(outcome)):
        raise CallFailed(f"{fn}'s answer is not a value or an error: {str(outcome)[:200]}")
    if "error" in outcome:
        error = outcome["error"] if isinstance(outcome["error"], dict) else {}
        kind, message = str(error.get("type", "Exception")), str(error.get("message", ""))
        raise (errors or {}).get(kind, CallFailed)(
            message if kind in (errors or {}) else f"{kind}: {message}"
        )
    return outcome["value"]


def _exchange(
    request: bytes, request_w: int, answer_r: int, lines_r: int, pid: int, timeout_s: float
) -> tuple[bytes, bytes, bool]:
    """Write ``request`` to the child, read its answer and log lines until it closes them (killing it
    past ``timeout_s``), then wait until it is gone. Closes the three descriptors."""
    writer = threading.Thread(target=_write_all, args=(request_w, request), daemon=True)
    writer.start()
    read: dict[int, bytearray] = {answer_r: bytearray(), lines_r: bytearray()}
    still_open = {answer_r, lines_r}
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while still_open:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                _kill(pid)
                break
            ready, _, _ = select.select(sorted(still_open), [], [], min(left, 0.2))
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    read[fd] += chunk
                else:
                    still_open.discard(fd)
            if not ready and not _exists(pid):  # the child is gone; what it started holds the pipes
                _kill(pid)
                deadline = min(deadline, time.monotonic() + 1.0)
    finally:
        os.close(answer_r)
        os.close(lines_r)
    writer.join(timeout=5)
    _kill(pid)  # its process group: whatever the child started ends with the call
    _wait_gone(pid)
    return bytes(read[answer_r]), bytes(read[lines_r]), timed_out


def _write_all(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:  # the child died before reading it all: its missing answer says so
        pass
    finally:
        os.close(fd)


def _kill(pid: int) -> None:
    """SIGKILL the child's process group: the child and everything it started (nothing when all are
    gone; never a lone pid, which may by now be another process's)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int) -> None:
    """Until ``pid`` no longer exists (the template has the kernel reap its children at once)."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.002)
    log.warning("process %d still exists %.0fs after closing its pipes", pid, GONE_TIMEOUT_S)


def _template_main(fd: int, preimports: list[str]) -> None:
    """The template: import once, then fork a child for each call's pipes until rank 0 goes."""
    import importlib

    channel = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps each child as it exits
    for name in preimports:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not needed by every call; the call itself says what it lacks
            pass
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(channel, 16, 3)
        except OSError:
            return
        if not message:
            return  # rank 0 closed its end, or died
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)  # a group of its own: killed whole, with whatever the call starts
                channel.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for target, source in enumerate(fds):
                    os.dup2(source, target)
                for source in fds:
                    os.close(source)
                _serve()
            finally:
                os._exit(1)
        for source in fds:
            os.close(source)
        channel.sendall(pid.to_bytes(8, "big"))


def _serve() -> None:
    """A forked child: read one request, run it, write the answer, exit."""
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the call prints goes with its log lines, never into the answer
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT, stream=sys.stderr, force=True)
    raw = bytearray()
    while chunk := os.read(0, 1 << 16):
        raw += chunk
    if not raw:
        _exit_now()  # rank 0 sent nothing: nothing to do
    request = pickle.loads(bytes(raw))
    os.environ.update(request["env"])
    try:
        from emr_ray.cluster.spec import import_by_path

        outcome: dict[str, Any] = {"value": import_by_path(request["fn"])(**request["kwargs"])}
    except Exception as e:
        outcome = {"error": {"type": type(e).__name__, "message": str(e)}}
    try:
        payload = json.dumps(outcome, allow_nan=True)
    except (TypeError, ValueError) as e:  # a value that is not data crosses back as why
        payload = json.dumps({"error": {"type": "CallFailed", "message": f"the answer is not JSON: {e}"}})
    answer.write(payload.encode())
    answer.flush()
    _exit_now()


def _exit_now() -> None:
    """End the child once it has answered, without tearing down torch and MLflow: the caller reads
    until the child's pipes close, so it would wait for that teardown."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _template_main(int(sys.argv[1]), sys.argv[2:])
