"""A running local Airflow on the embedded stack: API server (UI + REST), scheduler, DAG processor and
triggerer, all on 127.0.0.1, log servers off. Used by ``make airflow`` and the live-Airflow tests.

In production shape: the metadata database is the stack's PostgreSQL when it runs one
(``LocalStack(postgres=True)``); the LocalExecutor runs up to :data:`PARALLELISM` tasks at once, so
runs of different dates overlap as far as the pools and ``max_active_runs`` let them; operators
defer by default (``[operators] default_deferrable``), so a task waiting on a Ray job holds no
worker slot, only its pool slot (the pools count deferred tasks). A component can be SIGKILLed and
started again (:meth:`LocalAirflow.kill`, :meth:`LocalAirflow.restart`), as a crashed pod would be.

With ``executor="CeleryExecutor"`` (``make airflow EXECUTOR=celery``) the scheduler queues tasks in the
stack's Redis (``LocalStack(redis=True)``) and :data:`CELERY_WORKERS` Celery workers run them, each
its own process group (``worker-1``, ``worker-2``: either can be killed alone); Celery's results go
to the metadata database (PostgreSQL, required). The task slots stay :data:`PARALLELISM` in all,
split between the workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from devstack.stack import LocalStack
from emr_ray.params import PROMOTION_POOL, SPARK_POOL, TRAIN_POOL
from emr_ray.provider_info import DEFERRAL_SETTLE_SECONDS
from emr_ray.sizing.model import CPUS_PER_RAY_TASK, CPUS_PER_WARM_LANE, WARM_SLOTS_PER_LANE, ray_pool_slots  # noqa: F401 - the stack sizes its pools by the provider's rule

#: the ``airflow`` command of this interpreter's environment
AIRFLOW_CLI = str(Path(sys.executable).with_name("airflow"))
USER = "admin"
#: the pools the example DAGs' tasks take a slot of (``make airflow`` creates them)
POOLS = {
    SPARK_POOL: "Tasks that run Spark on Ray, sized from the cluster's lanes (README: Sizing the pools)",
    TRAIN_POOL: "Tasks that train on Ray, sized from the cluster's lanes (README: Sizing the pools)",
    PROMOTION_POOL: "Model promotions, one at a time: each decides against the champion the last one left",
}
COMPONENTS = {
    "api-server": ["api-server", "--host", "127.0.0.1", "--port", "{port}"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}
#: task slots of the LocalExecutor (or of all Celery workers together): what runs at once is then
#: decided by the pools and the DAGs
PARALLELISM = 4
EXECUTORS = ("LocalExecutor", "CeleryExecutor")
#: Celery workers of the CeleryExecutor topology, as on two machines
CELERY_WORKERS = 2


@dataclass
class LocalAirflow:
    """The Airflow processes (four, plus the Celery workers), started and stopped by PID (never orphaned).

    A component that exits while the stack is up is started again, as systemd or Kubernetes would;
    ``restarts`` counts them. One that :meth:`kill` took down stays down until :meth:`restart`.
    """

    stack: LocalStack
    home: Path
    port: int = 8080
    #: slots of each Ray pool (``ray_spark``, ``ray_train``); None: :func:`ray_pool_slots` of the stack's CPUs
    pool_slots: int | None = None
    #: seconds without a heartbeat before a scheduler or triggerer counts as dead, and between the
    #: scheduler's checks for a dead one's tasks; None: Airflow's 30 s (checks every 30 s here). Only
    #: the test stack shortens it: a busy machine may then delay a live component's beat past it.
    health_check_s: int | None = None
    #: seconds between the asset watcher's listings of COS (``retrain_on_arrival``); None: the
    #: ``EMR_RAY_WATCH_INTERVAL`` variable of this process, else 10
    watch_interval_s: int | None = None
    #: seconds between a task's tries in the DAGs (``EMR_RAY_RETRY_DELAY``); None: the DAGs' 120
    retry_delay_s: int | None = None
    #: ``LocalExecutor`` or ``CeleryExecutor`` (its broker: the stack's Redis)
    executor: str = "LocalExecutor"
    #: seconds without a heartbeat from a running task before the scheduler fails its try (a killed
    #: Celery worker's tasks); None: Airflow's 300
    task_heartbeat_timeout_s: int | None = None
    #: ``[emr_ray] deferral_settle_seconds``: how long a Ray trigger holds a finished job's event after
    #: the deferral (the provider's default; the system tests take 0 and an occasional retry instead)
    deferral_settle_s: float = DEFERRAL_SETTLE_SECONDS
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _down: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor={self.executor!r}: use one of {', '.join(EXECUTORS)}")
        if self.celery and not (self.stack.postgres and self.stack.redis):
            raise ValueError(
                "the CeleryExecutor needs the stack's PostgreSQL and Redis: LocalStack(postgres=True, redis=True)"
            )

    @property
    def celery(self) -> bool:
        return self.executor == "CeleryExecutor"

    def components(self) -> dict[str, list[str]]:
        """Each component's ``airflow`` arguments, by name (the Celery workers under ``worker-N``)."""
        if not self.celery:
            return dict(COMPONENTS)
        concurrency = str(max(1, PARALLELISM // CELERY_WORKERS))
        workers = {
            f"worker-{n}": ["celery", "worker", "--celery-hostname", f"worker-{n}@%h", "--concurrency", concurrency,
                            "--skip-serve-logs", "--pid", str(self.home / f"airflow-worker-{n}.pid")]
            for n in range(1, CELERY_WORKERS + 1)
        }  # fmt: skip
        return COMPONENTS | workers

    def executor_env(self) -> dict[str, str]:
        """The executor's settings (Celery: its broker, and results in the metadata database)."""
        env = {"AIRFLOW__CORE__EXECUTOR": self.executor}
        if self.task_heartbeat_timeout_s:
            env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] = str(self.task_heartbeat_timeout_s)
        if self.celery:
            env |= {
                "AIRFLOW__CELERY__BROKER_URL": self.stack.broker_url,
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(max(1, PARALLELISM // CELERY_WORKERS)),
                # Airflow's default, said explicitly: a killed worker's task is not redelivered by the
                # broker (the scheduler fails its try once its heartbeat stops, and retries it)
                "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
                # a task no worker started (its message was lost with a killed worker or broker) is
                # queued again after this, instead of Airflow's 10 minutes
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(max(60, 4 * (self.health_check_s or 30))),
            }
        return env

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return os.environ | self.stack.airflow_env() | {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            **self.executor_env(),
            "AIRFLOW__CORE__PARALLELISM": str(PARALLELISM),
            # a task waiting on a Ray job (or on a COS key) waits in the triggerer, not in a worker slot
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
            # executors report a deferring process's exit here: a hold before a trigger answers
            "AIRFLOW__EMR_RAY__DEFERRAL_SETTLE_SECONDS": str(self.deferral_settle_s),
            # a scheduler that died is seen dead after scheduler_health_check_threshold (30 s, or
            # health_check_s); its queued and running tasks are then reset at the next check (default
            # every 300 s; here 30 s or health_check_s). A dead triggerer's triggers move likewise.
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": str(self.health_check_s or 30),
            **({"AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": str(self.health_check_s),
                "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(self.health_check_s)}
               if self.health_check_s else {}),
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            # retrain_on_arrival's asset watcher lists COS this often (its DAG reads it when parsed)
            "EMR_RAY_WATCH_INTERVAL": str(self.watch_interval_s or os.environ.get("EMR_RAY_WATCH_INTERVAL", "10")),
            **({"EMR_RAY_RETRY_DELAY": str(self.retry_delay_s)} if self.retry_delay_s else {}),
        }  # fmt: skip

    def _airflow(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [AIRFLOW_CLI, *args], env=self.env(), check=True, capture_output=True, text=True
        )

    def start(self, timeout: float = 240) -> LocalAirflow:
        self.home.mkdir(parents=True, exist_ok=True)
        self._airflow("db", "migrate")
        logs = self.home / "logs"
        logs.mkdir(exist_ok=True)
        pools = self._import_pools()  # one CLI start, while the components start
        for name in self.components():
            self._launch(name)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as response:
                    if response.status == 200:
                        if pools.wait(timeout=max(1.0, deadline - time.monotonic())):
                            raise RuntimeError(f"airflow pools import failed; see {logs / 'pools.log'}")
                        threading.Thread(
                            target=self._supervise, name="airflow-supervisor", daemon=True
                        ).start()
                        return self
            except Exception:
                pass
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"Airflow {name} exited with {process.returncode}; see {logs / name}.log"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"Airflow API at {self.url} did not answer within {timeout:.0f}s")
            time.sleep(2)

    def _import_pools(self) -> subprocess.Popen:
        """``airflow pools import`` of every pool, started (the caller waits). Ray tasks take a slot of
        their kind's pool, deferred ones too: runs queue instead of oversubscribing the cluster, and a
        run's training never waits behind later preprocessing."""
        slots = self.pool_slots or ray_pool_slots(self.stack.num_cpus)
        pools = {
            pool: {"slots": 1 if pool == PROMOTION_POOL else slots, "description": description,
                   "include_deferred": True}
            for pool, description in POOLS.items()
        }  # fmt: skip
        path = self.home / "pools.json"
        path.write_text(json.dumps(pools))
        out = open(self.home / "logs" / "pools.log", "w")  # noqa: SIM115 - kept open for the child's lifetime
        return subprocess.Popen([AIRFLOW_CLI, "pools", "import", str(path)], env=self.env(), stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip

    def _launch(self, name: str) -> None:
        out = open(self.home / "logs" / f"{name}.log", "a")  # noqa: SIM115 - kept open for the child's lifetime
        argv = [AIRFLOW_CLI, *(a.format(port=self.port) for a in self.components()[name])]
        self.processes[name] = subprocess.Popen(argv, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)  # fmt: skip

    def _supervise(self) -> None:
        while not self._stopping.wait(5):
            with self._lock:
                for name, process in list(self.processes.items()):
                    if process.poll() is not None and name not in self._down and not self._stopping.is_set():
                        self.restarts[name] = self.restarts.get(name, 0) + 1
                        print(f"Airflow {name} exited with {process.returncode}; starting it again "
                              f"(see {self.home / 'logs' / name}.log)", file=sys.stderr, flush=True)  # fmt: skip
                        self._launch(name)

    def pid(self, name: str) -> int:
        """The pid of component ``name``'s main process (``api-server``, ``scheduler``, ...)."""
        process = self.processes[name]
        if process.poll() is not None:
            raise RuntimeError(f"Airflow {name} is not running (exit {process.returncode})")
        return process.pid

    def cpu_seconds(self) -> dict[str, float]:
        """CPU-seconds each component's processes have used so far (user + system), task processes
        included: a component's live processes and every child they reaped (:func:`tree_cpu_seconds`)."""
        return {name: tree_cpu_seconds(process.pid) for name, process in self.processes.items()}

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Take component ``name`` down as a crash would (a killed pod): ``sig`` to its main process and
        every process under it (LocalExecutor workers, task supervisors and task runners, the trigger
        runner), which leaves the database as the crash left it. It stays down until :meth:`restart`."""
        with self._lock:
            self._down.add(name)
            process = self.processes[name]
            _signal_tree(process.pid, sig)
            process.wait(timeout=30)

    def restart(self, name: str) -> int:
        """Start component ``name`` again (after :meth:`kill`); returns its new pid."""
        with self._lock:
            if self.processes[name].poll() is None:
                raise RuntimeError(f"Airflow {name} is still running (pid {self.processes[name].pid})")
            self._down.discard(name)
            self._launch(name)
            return self.processes[name].pid

    def password(self) -> str:
        generated = self.home / "simple_auth_manager_passwords.json.generated"
        return json.loads(generated.read_text())[USER]

    def token(self) -> str:
        body = json.dumps({"username": USER, "password": self.password()}).encode()
        request = urllib.request.Request(f"{self.url}/auth/token", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["access_token"]

    def stop(self) -> None:
        """SIGTERM each component's process group, then SIGKILL what is left of it, task runners (each
        in a process group of its own) included."""
        self._stopping.set()
        with self._lock:
            tree = [p for process in self.processes.values() for p in _tree(process.pid)]
            for process in self.processes.values():
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            for process in self.processes.values():
                try:
                    process.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)
            _, alive = psutil.wait_procs(tree, timeout=max(1.0, deadline - time.monotonic()))
            for leftover in alive:
                with contextlib.suppress(psutil.Error):
                    leftover.kill()
            self.processes.clear()


def _tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants (those that still run)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """CPU-seconds of process ``pid`` and its descendants: each live one's own user + system time plus
    what its reaped children used (the kernel adds a child's times to its parent's when the parent
    waits for it). A process that ended unreaped, or whose parent died first, is not counted."""
    total = 0.0
    for process in _tree(pid):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def _signal_tree(pid: int, sig: signal.Signals) -> None:
    """``sig`` to ``pid`` and its descendants, children first seen, all in one pass (none gets to react)."""
    tree = _tree(pid)
    for process in tree:
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)
    psutil.wait_procs(tree[1:], timeout=10)
