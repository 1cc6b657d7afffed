"""A running local Airflow on the embedded stack: API server (UI + REST), scheduler, DAG processor and
triggerer, all on 127.0.0.1, log servers off. Used by ``make airflow`` and the live-Airflow tests.
"""

from __future__ import annotations

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

from devstack.stack import LocalStack

USER = "admin"
COMPONENTS = {
    "api-server": ["api-server", "--host", "127.0.0.1", "--port", "{port}"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}


@dataclass
class LocalAirflow:
    """The four Airflow processes, started and stopped by PID (never orphaned).

    A component that exits while the stack is up is started again, as systemd or Kubernetes would
    (on SQLite the scheduler can die on a row another process rolled back); ``restarts`` counts them.
    """

    stack: LocalStack
    home: Path
    port: int = 8080
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    _stopping: threading.Event = field(default_factory=threading.Event)

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
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "3",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        }  # fmt: skip

    def _airflow(self, *args: str) -> subprocess.CompletedProcess:
        cli = str(Path(sys.executable).with_name("airflow"))
        return subprocess.run([cli, *args], env=self.env(), check=True, capture_output=True, text=True)

    def start(self, timeout: float = 240) -> LocalAirflow:
        self.home.mkdir(parents=True, exist_ok=True)
        self._airflow("db", "migrate")
        # Every Ray-heavy task takes the one slot: runs queue instead of oversubscribing the cluster.
        self._airflow("pools", "set", "ray_cluster", "1", "Tasks that run Ray jobs on the local cluster")
        # Promotions of a model one at a time: each decides against the champion the previous one left.
        self._airflow("pools", "set", "mlflow_promotion", "1", "Model promotions, one at a time")
        logs = self.home / "logs"
        logs.mkdir(exist_ok=True)
        for name in COMPONENTS:
            self._launch(name)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as response:
                    if response.status == 200:
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

    def _launch(self, name: str) -> None:
        cli = str(Path(sys.executable).with_name("airflow"))
        out = open(self.home / "logs" / f"{name}.log", "a")  # noqa: SIM115 - kept open for the child's lifetime
        argv = [cli, *(a.format(port=self.port) for a in COMPONENTS[name])]
        self.processes[name] = subprocess.Popen(argv, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)  # fmt: skip

    def _supervise(self) -> None:
        while not self._stopping.wait(5):
            for name, process in list(self.processes.items()):
                if process.poll() is not None and not self._stopping.is_set():
                    self.restarts[name] = self.restarts.get(name, 0) + 1
                    print(f"Airflow {name} exited with {process.returncode}; starting it again "
                          f"(see {self.home / 'logs' / name}.log)", file=sys.stderr, flush=True)  # fmt: skip
                    self._launch(name)

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
        """SIGTERM each component's process group, then SIGKILL what is left."""
        self._stopping.set()
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.processes.values():
            try:
                process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        self.processes.clear()
