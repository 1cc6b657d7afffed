"""The embedded default stack, shared by ``make demo`` and the tests: COS stand-in, Ray head, MLflow store,
Airflow home, all on 127.0.0.1 and all under one state folder.

``LocalStack.start()`` brings the services up; ``airflow_env()`` is the environment (connections as
``AIRFLOW_CONN_*``, storage roots as ``AIRFLOW_VAR_*``) under which the DAGs run unchanged. With
``mlflow_ui_port`` it also serves the MLflow UI (``mlflow server`` over the same SQLite store and
artifact folder) and gives the ``mlflow_default`` connection its ``ui_url``, so tasks store links
to their run and model version pages.

With ``postgres=True`` it also runs a PostgreSQL server (:mod:`devstack.postgres`, data under
``<root>/postgres``, on a Unix socket) and Airflow's metadata database is its ``airflow`` database, as
in production; with ``mlflow_on_postgres=True`` MLflow's tracking store is its ``mlflow`` database.
Otherwise both are SQLite files under ``root``. An ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` set in the
environment always wins. ``airflow dags test`` (:meth:`LocalStack.dags_test_env`) always uses SQLite.

With ``redis=True`` it also runs a Redis server (:mod:`devstack.broker`, under ``<root>/redis``, on
127.0.0.1): the CeleryExecutor's broker (``LocalAirflow(executor="CeleryExecutor")``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack import airflow_db
from devstack.broker import LocalRedis
from devstack.constants import BUCKET, REGION, SECRET_ID, SECRET_KEY
from devstack.postgres import LocalPostgres
from devstack.ray_head import LocalRay, start_head, stop_head


@dataclass
class LocalStack:
    """One isolated local environment: ``rm -rf root`` resets everything.

    Pass an already running ``cos`` stand-in or ``ray`` head to share them (the tests do).

    :param dashboard_port: the Ray dashboard's (and Jobs API's) port on 127.0.0.1, when this stack
        starts the head.
    :param mlflow_ui_port: serve the MLflow UI on 127.0.0.1 at this port (None: no UI, no links).
    :param postgres: run a PostgreSQL server for Airflow's metadata database (else SQLite).
    :param mlflow_on_postgres: MLflow's tracking store in that server's ``mlflow`` database (else SQLite).
    :param redis: run a Redis server, the CeleryExecutor's broker.
    :param connection_overrides: fields merged into :meth:`connections` (``extra`` key by key): the
        chaos soak points ``ray_default`` and ``cos_default`` at fault proxies, ``mlflow_default`` at
        the MLflow server.
    """

    root: Path
    project_root: Path
    num_cpus: int = 2
    cos: Any = None
    ray: LocalRay | None = None
    dashboard_port: int = 8265
    mlflow_ui_port: int | None = None
    postgres: bool = False
    mlflow_on_postgres: bool = False
    redis: bool = False
    connection_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: seconds a warm pool of the DAGs (Spark session, training worker group) waits unused (the
    #: ``emr_ray_spark_idle_timeout`` and ``emr_ray_worker_group_idle_timeout`` Variables)
    warm_idle_timeout: int = 600
    _owns_ray: bool = field(default=False, repr=False)
    _owns_cos: bool = field(default=False, repr=False)
    _mlflow_ui: subprocess.Popen | None = field(default=None, repr=False)
    _postgres: LocalPostgres | None = field(default=None, repr=False)
    _redis: LocalRedis | None = field(default=None, repr=False)

    def start(self) -> LocalStack:
        from devstack.cos_server import CosStandIn

        self.root = self.root.resolve()
        for sub in ("airflow", "mlflow/artifacts", "data", "ray"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        if self.cos is None:
            self.cos = CosStandIn().start()
            self._owns_cos = True
        self.cos.create_bucket(BUCKET)
        self.cos.register_credentials(SECRET_ID, SECRET_KEY)
        if self.ray is None:
            self.ray = start_head(
                self.root / "ray", num_cpus=self.num_cpus, dashboard_port=self.dashboard_port
            )
            self._owns_ray = True
        airflow_on_postgres = self.postgres and not airflow_db.user_conn(dict(os.environ))
        if (airflow_on_postgres or self.mlflow_on_postgres) and self._postgres is None:
            databases = ("airflow", "mlflow") if self.mlflow_on_postgres else ("airflow",)
            self._postgres = LocalPostgres(self.root / "postgres", databases=databases).start()
        if self.redis and self._redis is None:
            self._redis = LocalRedis(self.root / "redis").start()
        if self.mlflow_ui_port is not None and self._mlflow_ui is None:
            self._mlflow_ui = self._start_mlflow_ui(self.mlflow_ui_port)
        return self

    def _start_mlflow_ui(self, port: int, timeout: float = 120) -> subprocess.Popen:
        """``mlflow server`` on 127.0.0.1:``port`` over this stack's tracking store: the UI the links open.

        Runs read the artifacts straight from ``artifact_root`` (the jobs write there), so the server
        serves no artifacts of its own; its job runner is off (nothing here submits server jobs).
        """
        url = f"http://127.0.0.1:{port}"
        log = self.root / "mlflow" / "server.log"
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
        env |= {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                "--workers", "1", "--backend-store-uri", self.tracking_uri,
                "--default-artifact-root", self.artifact_root, "--no-serve-artifacts"]  # fmt: skip
        with log.open("ab") as out:
            process = subprocess.Popen(argv, cwd=self.root / "mlflow", env=env, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        return process
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                self._stop_group(process)
                raise RuntimeError(f"the MLflow UI did not start on {url}; see {log}")
            time.sleep(0.5)

    def restart_mlflow_ui(self) -> None:
        """Stop the MLflow server (SIGKILL, as a crashed pod) and start it again on the same port."""
        if self._mlflow_ui is None or self.mlflow_ui_port is None:
            raise RuntimeError("this stack runs no MLflow server (mlflow_ui_port=..., then start())")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._mlflow_ui.pid, signal.SIGKILL)
        self._mlflow_ui.wait(timeout=30)
        self._mlflow_ui = self._start_mlflow_ui(self.mlflow_ui_port)

    @staticmethod
    def _stop_group(process: subprocess.Popen) -> None:
        """SIGTERM the process group of ``process`` (uvicorn and its worker), SIGKILL what is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=10)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        """Stop what ``start()`` started (services passed in by the caller stay up)."""
        if self._mlflow_ui is not None:
            self._stop_group(self._mlflow_ui)
            self._mlflow_ui = None
        if self._owns_ray:
            stop_head(self.root / "ray")
        if self._owns_cos:
            self.cos.stop()
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        if self._postgres is not None:  # last: whatever ran on this stack is stopped by now
            self._postgres.stop()
            self._postgres = None

    # -- addresses --------------------------------------------------------------------------------
    @property
    def postgres_server(self) -> LocalPostgres:
        """The running PostgreSQL server (``postgres`` or ``mlflow_on_postgres``, after ``start()``)."""
        if self._postgres is None:
            raise RuntimeError("this stack runs no PostgreSQL server (postgres=True, then start())")
        return self._postgres

    @property
    def broker_url(self) -> str:
        """The CeleryExecutor's broker (``redis=True``, after ``start()``)."""
        if self._redis is None:
            raise RuntimeError("this stack runs no Redis server (redis=True, then start())")
        return self._redis.url()

    @property
    def tracking_uri(self) -> str:
        if self.mlflow_on_postgres:
            return self.postgres_server.url("mlflow")  # psycopg2: SQLAlchemy 2.1 would pick psycopg 3
        return f"sqlite:///{self.root / 'mlflow' / 'mlflow.db'}"

    @property
    def artifact_root(self) -> str:
        return f"file://{self.root / 'mlflow' / 'artifacts'}"

    @property
    def mlflow_ui_url(self) -> str | None:
        """Where the MLflow UI answers (None without ``mlflow_ui_port``)."""
        return f"http://127.0.0.1:{self.mlflow_ui_port}" if self.mlflow_ui_port is not None else None

    @property
    def raw_uri(self) -> str:
        return f"cos://{BUCKET}/raw"

    @property
    def digits_raw_uri(self) -> str:
        return f"cos://{BUCKET}/raw_digits"

    @property
    def staging_uri(self) -> str:
        return f"file://{self.root / 'data' / 'staging'}"

    @property
    def checkpoint_uri(self) -> str:
        return f"file://{self.root / 'data'}"

    def storage_options(self):
        """pyarrow settings for the COS stand-in (for writing sample data and reading results)."""
        from emr_ray.cluster.storage import StorageOptions

        return StorageOptions(endpoint_override=self.cos.endpoint, scheme="http", region=REGION,
                              access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip

    def connections(self) -> dict[str, dict[str, Any]]:
        assert self.ray is not None and self.cos is not None
        connections = self._connections()
        for conn_id, fields in self.connection_overrides.items():
            extra = connections[conn_id].get("extra", {}) | fields.get("extra", {})
            connections[conn_id] = connections[conn_id] | fields | {"extra": extra}
        return connections

    def _connections(self) -> dict[str, dict[str, Any]]:
        assert self.ray is not None and self.cos is not None
        return {
            "ray_default": {
                "conn_type": "ray",
                "host": self.ray.dashboard_url,
                "password": self.ray.token,
                # How the cluster finds include/: on EMR this is the project's install path.
                "extra": {"runtime_env": self.ray.job_runtime_env(self.project_root)},
            },
            "cos_default": {
                "conn_type": "cos",
                "login": SECRET_ID,
                "password": SECRET_KEY,
                "extra": {
                    "region": REGION,
                    "bucket": BUCKET,
                    "scheme": "http",
                    "endpoint": self.cos.endpoint,
                },
            },
            "mlflow_default": {
                "conn_type": "mlflow",
                "host": self.tracking_uri,
                # ui_url: the tracking URI is a database, so links need the UI's own address
                "extra": {"artifact_location": self.artifact_root}
                | ({"ui_url": self.mlflow_ui_url} if self.mlflow_ui_url else {}),
            },
        }

    def dags_test_env(self) -> dict[str, str]:
        """:meth:`airflow_env` for ``airflow dags test``, which in Airflow 3.3.2 cannot finish a run of
        a DAG with a deadline: deadlines off (see ``emr_ray.deadlines.warn_after``). OpenLineage events
        (one JSON per line) go to ``<root>/openlineage.jsonl`` (:mod:`emr_ray.lineage`)."""
        transport = {"type": "file", "log_file_path": str(self.root / "openlineage.jsonl"), "append": True}
        return self.airflow_env(sqlite=True) | {
            "EMR_RAY_DEADLINES": "off",
            # no executor runs a dags-test task, so no executor report can race its trigger
            "AIRFLOW__EMR_RAY__DEFERRAL_SETTLE_SECONDS": "0",
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "emr-ray-local",
        }

    def airflow_env(self, *, sqlite: bool = False) -> dict[str, str]:
        """Environment for Airflow processes (CLI, ``dags test``, scheduler) running on this stack.

        :param sqlite: SQLite in ``AIRFLOW_HOME`` even when this stack runs PostgreSQL (``dags test``).
        """
        env = {
            "AIRFLOW_HOME": str(self.root / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.project_root / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.project_root / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            **self.airflow_db_env(sqlite=sqlite),
            "AIRFLOW_VAR_EMR_RAY_RAW_URI": self.raw_uri,
            "AIRFLOW_VAR_EMR_RAY_DIGITS_RAW_URI": self.digits_raw_uri,
            "AIRFLOW_VAR_EMR_RAY_STAGING_URI": self.staging_uri,
            "AIRFLOW_VAR_EMR_RAY_CHECKPOINT_URI": self.checkpoint_uri,
            "AIRFLOW_VAR_EMR_RAY_SPARK_IDLE_TIMEOUT": str(self.warm_idle_timeout),
            "AIRFLOW_VAR_EMR_RAY_WORKER_GROUP_IDLE_TIMEOUT": str(self.warm_idle_timeout),
            # the project root: where these processes import include/ and devstack (the connect args above)
            "PYTHONPATH": os.pathsep.join([str(self.project_root), os.environ.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
        }
        for conn_id, conn in self.connections().items():
            env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(conn)
        return env

    def airflow_db_env(self, *, sqlite: bool = False) -> dict[str, str]:
        """Airflow's metadata database settings: the user's ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``
        (or ``_CMD``, ``_SECRET``) when set, else this stack's PostgreSQL when it runs one (and not
        ``sqlite``), else Airflow's default SQLite file in ``AIRFLOW_HOME``."""
        if airflow_db.user_conn(dict(os.environ)):
            mine = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
            return airflow_db.sqlite_env() if mine.startswith("sqlite") else {}
        if self.postgres and not sqlite:
            return {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.postgres_server.url("airflow")}
        return airflow_db.sqlite_env()
