"""What each fault of the chaos soak does to the running local stack (the kinds of
:mod:`devstack.chaos_schedule`), and the thread that injects a schedule, logging each fault as one JSON
line (the audit counts them by kind). The soak is ``bench.chaos``; its short version is
``tests/system/test_chaos.py``: both use this injector.

Every fault is undone as an operator's platform would undo it: a killed Airflow component or Celery
worker is started again after ``down_s`` (as Kubernetes restarts a pod), the Ray worker node joins
again, an outage ends, a paused driver continues. Where a fault finds nothing to hit (no Ray job
running to pause), it waits for one up to a minute, then logs itself as skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from devstack.airflow import CELERY_WORKERS, LocalAirflow
from devstack.airflow_client import DAG_ID
from devstack.chaos_schedule import Fault
from devstack.fault_proxy import FaultProxy
from devstack.ray_head import SECOND_NODE_PORTS, _ray_processes_in_this_namespace, add_worker_node
from devstack.stack import LocalStack

#: how long a fault waits for something to hit (a running Ray job, a busy Celery worker)
TARGET_WAIT_S = 60.0


@dataclass
class Injector:
    """Injects faults into one running stack: Airflow (CeleryExecutor), the Ray head and its worker
    node, the Jobs API and COS behind their fault proxies, PostgreSQL, the MLflow server."""

    airflow: LocalAirflow
    stack: LocalStack
    jobs_proxy: FaultProxy | None  # None where no fault of the Jobs API or of COS is drawn
    cos_proxy: FaultProxy | None
    log_path: Path
    #: a running task instance's run, task and try by its id (a killed worker's task is reported by them)
    find_task: Callable[[str], dict[str, Any] | None] | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, faults: list[Fault], started: float) -> threading.Thread:
        """Inject ``faults`` at their seconds after ``started`` (``time.monotonic()``), each in a thread
        of its own, so a long one (an outage) never delays the next: faults overlap as they come.
        The returned thread ends when every fault has ended."""

        def timeline() -> None:
            threads = []
            for fault in faults:
                if self.stopping.wait(max(0.0, started + fault.at_s - time.monotonic())):
                    break
                thread = threading.Thread(target=self.inject, args=(fault, started), name=f"chaos-{fault.kind}",
                                          daemon=True)  # fmt: skip
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join()

        thread = threading.Thread(target=timeline, name="chaos-faults", daemon=True)
        thread.start()
        return thread

    def inject(self, fault: Fault, started: float) -> dict[str, Any]:
        began = time.monotonic()
        record: dict[str, Any] = fault.as_dict() | {"started_s": round(began - started, 1)}
        try:
            record |= getattr(self, fault.kind)(**fault.params) or {}
        except Exception as e:  # a fault that could not be injected is logged, never fatal to the soak
            record["error"] = f"{type(e).__name__}: {e}"
        record["ended_s"] = round(time.monotonic() - started, 1)
        with self._lock, self.log_path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        print(f"chaos: {json.dumps(record)}", flush=True)
        return record

    # -- Airflow -----------------------------------------------------------------------------------
    def _down_and_up(self, name: str, down_s: float) -> dict[str, Any]:
        self.airflow.kill(name)
        self.stopping.wait(down_s)
        self.airflow.restart(name)
        return {"target": name}

    def kill_celery_worker(self, worker: int, down_s: float) -> dict[str, Any]:
        """SIGKILL a Celery worker with its task processes, mid-task: the drawn one when it runs a
        task, else the other one when that does, else (after waiting) the drawn one."""
        names = [f"worker-{(worker - 1 + i) % CELERY_WORKERS + 1}" for i in range(CELERY_WORKERS)]
        deadline = time.monotonic() + TARGET_WAIT_S
        busy, task = None, None
        while busy is None and time.monotonic() < deadline and not self.stopping.is_set():
            for name in names:
                if task := _running_task(self.airflow.pid(name)):
                    busy = name
                    break
            else:
                time.sleep(0.5)
        found = None
        if task and self.find_task is not None:
            with contextlib.suppress(Exception):  # the report's detail, never the fault's
                found = self.find_task(task)
        return self._down_and_up(busy or names[0], down_s) | {
            "mid_task": busy is not None,
            "task_instance": task,
            **({"task": found} if found else {}),
        }

    def kill_scheduler(self, down_s: float) -> dict[str, Any]:
        return self._down_and_up("scheduler", down_s)

    def kill_triggerer(self, down_s: float) -> dict[str, Any]:
        return self._down_and_up("triggerer", down_s)

    # -- Ray ---------------------------------------------------------------------------------------
    def kill_raylet(self, down_s: float) -> dict[str, Any]:
        """SIGKILL the worker node's raylet (its workers and agents go with it), then join the node again."""
        ports = {str(p) for p in SECOND_NODE_PORTS.values()}
        node = [pid for pid in _ray_processes_in_this_namespace() if ports & set(_cmdline_numbers(pid))]
        raylet = [pid for pid in node if "raylet" in _cmdline(pid).split(" ", 1)[0]]
        for pid in raylet + node:  # the raylet first: what a crashed machine does to it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        psutil.wait_procs([p for pid in node if (p := _process(pid))], timeout=20)
        self.stopping.wait(down_s)
        assert self.stack.ray is not None
        for attempt in range(3):
            try:
                add_worker_node(self.stack.ray, num_cpus=1)
                break
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(5)
        return {"target": f"raylet {raylet}", "node_processes": len(node)}

    def pause_driver(self, down_s: float) -> dict[str, Any]:
        """SIGSTOP a running Ray job's driver for ``down_s``, then SIGCONT."""
        deadline = time.monotonic() + TARGET_WAIT_S
        while time.monotonic() < deadline and not self.stopping.is_set():
            running = [
                j
                for j in self._jobs()
                if j.get("status") == "RUNNING"
                and j.get("submission_id")
                and (j.get("driver_info") or {}).get("pid")
            ]
            if running:
                job = sorted(running, key=lambda j: j["submission_id"])[0]
                pid = int(job["driver_info"]["pid"])
                os.kill(pid, signal.SIGSTOP)
                try:
                    self.stopping.wait(down_s)
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                return {"target": job["submission_id"]}
            time.sleep(1)
        return {"skipped": "no Ray job was running"}

    def kill_spark_executor(self) -> dict[str, Any]:
        """SIGKILL a live Spark executor (RayDP's ``RayDPExecutor`` actor), mid-job when one runs."""
        return self._kill_actor("RayDPExecutor")

    def kill_warm_actor(self) -> dict[str, Any]:
        """SIGKILL one rank of a warm training group (a ``TrainWorker`` actor), mid-job when one runs."""
        return self._kill_actor("TrainWorker")

    def _kill_actor(self, class_name: str) -> dict[str, Any]:
        """SIGKILL a live actor of ``class_name`` (the lowest pid): waits (up to :data:`TARGET_WAIT_S`)
        for one to be alive while a Ray job runs, so the kill lands mid-job where it can. (A warm
        Spark session's executors live only while the session does: it stops when idle.)"""
        deadline = time.monotonic() + TARGET_WAIT_S
        pids: list[int] = []
        while not self.stopping.is_set():
            pids = sorted(int(a["pid"]) for a in self._actors(class_name) if a.get("pid"))
            running = any(j.get("status") == "RUNNING" for j in self._jobs())
            if (pids and running) or time.monotonic() >= deadline:
                break
            time.sleep(1)
        if not pids:
            return {"skipped": f"no live {class_name} actor within {TARGET_WAIT_S:.0f} s"}
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGKILL)
        return {
            "target": f"{class_name} [{pids[0]}]",
            "mid_job": any(j.get("status") == "RUNNING" for j in self._jobs()),
        }

    def _actors(self, class_name: str) -> list[dict[str, Any]]:
        """The live actors whose class name ends with ``class_name`` (a Java actor's is qualified:
        RayDP's executor is ``org.apache.spark...RayDPExecutor``), from the dashboard's state API."""
        assert self.stack.ray is not None
        query = urllib.parse.urlencode(
            [("filter_keys", "state"), ("filter_predicates", "="), ("filter_values", "ALIVE"), ("detail", "1"),
             ("limit", "10000")]
        )  # fmt: skip
        request = urllib.request.Request(f"{self.stack.ray.dashboard_url}/api/v0/actors?{query}",
                                         headers={"Authorization": f"Bearer {self.stack.ray.token}"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.loads(response.read())
        found = (body.get("data") or {}).get("result") or {}
        actors = found.get("result", []) if isinstance(found, dict) else found
        return [a for a in actors if str(a.get("class_name") or "").split(".")[-1].endswith(class_name)]

    def _jobs(self) -> list[dict[str, Any]]:
        assert self.stack.ray is not None
        request = urllib.request.Request(f"{self.stack.ray.dashboard_url}/api/jobs/",
                                         headers={"Authorization": f"Bearer {self.stack.ray.token}"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    @staticmethod
    def _proxy(proxy: FaultProxy | None) -> FaultProxy:
        assert proxy is not None, "this fault needs its service behind a fault proxy"
        return proxy

    # -- services ----------------------------------------------------------------------------------
    def jobs_api_outage(self, down_s: float) -> dict[str, Any]:
        with self._proxy(self.jobs_proxy).fault("refuse"):
            self.stopping.wait(down_s)
        return {"target": "Jobs API"}

    def cos_503_burst(self, down_s: float) -> dict[str, Any]:
        before = self._proxy(self.cos_proxy).counts().get("status", 0)
        with self._proxy(self.cos_proxy).fault("status", status=503):
            self.stopping.wait(down_s)
        return {
            "target": "COS",
            "requests_refused": self._proxy(self.cos_proxy).counts().get("status", 0) - before,
        }

    def cos_slow_burst(self, down_s: float, delay_s: float) -> dict[str, Any]:
        before = self._proxy(self.cos_proxy).counts().get("delay", 0)
        with self._proxy(self.cos_proxy).fault("delay", delay=delay_s):
            self.stopping.wait(down_s)
        return {
            "target": "COS",
            "requests_delayed": self._proxy(self.cos_proxy).counts().get("delay", 0) - before,
        }

    def restart_postgres(self, down_s: float) -> dict[str, Any]:
        server = self.stack.postgres_server
        server.stop()
        self.stopping.wait(down_s)
        server.start()
        return {"target": "PostgreSQL"}

    def restart_mlflow(self, down_s: float) -> dict[str, Any]:
        self.stack.restart_mlflow_ui()
        return {"target": "MLflow server"}


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cmdline_numbers(pid: int) -> list[str]:
    """The numbers in a process's arguments (``--node_manager_port=20030`` gives ``20030``)."""
    return [part.rpartition("=")[2] for part in _cmdline(pid).split()]


def _running_task(worker_pid: int) -> str | None:
    """The task instance id a Celery worker runs now (its task runner's title is ``airflow worker --
    <ti id>``), or None."""
    try:
        processes = psutil.Process(worker_pid).children(recursive=True)
    except psutil.Error:
        return None
    for process in processes:
        title = _cmdline(process.pid).strip()
        if title.startswith("airflow worker -- "):
            return title.removeprefix("airflow worker -- ")
    return None


def task_finder(api: Any) -> Callable[[str], dict[str, Any] | None]:
    """For the injector: a running task instance's run, task and try, by its id (a Celery worker's
    task runner names only the id; a retry gets another one, so it is looked up at the kill). In any
    state: the worker's process may outlive its try's running state by a moment (the try deferred
    or ended), and the kill still lands on that try."""

    def find(ti_id: str) -> dict[str, Any] | None:
        path = f"/api/v2/dags/{DAG_ID}/dagRuns/~/taskInstances?limit=1000"
        for ti in api.call("GET", path, retries=2)["task_instances"]:
            if ti["id"] == ti_id:
                return {"run_id": ti["dag_run_id"], "task_id": ti["task_id"], "try_number": ti["try_number"]}
        return None

    return find


def worker_recoveries(api: Any, fault_log: Any) -> list[dict[str, Any]]:
    """How Airflow recovered each task a Celery worker was killed under: its run, task and try at
    the kill (the fault's record), its last try and state (after the runs ended)."""
    found = []
    for line in fault_log.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        killed = record.get("task") if record.get("kind") == "kill_celery_worker" else None
        if killed:
            last = api.task_instances(killed["run_id"]).get(killed["task_id"], {})
            found.append(killed | {"killed_at_s": record["started_s"], "last_try": last.get("try_number"),
                                   "state": last.get("state")})  # fmt: skip
    return found
