"""MLflow with a login, end to end: a real ``mlflow server --app-name basic-auth``, the real Ray head.

The ``mlflow_auth`` connection holds the ordinary user ``trainer`` and its random password. One
training (``TorchTrainOperator``, one worker, two epochs on 500 rows) logs to the server from the
cluster; ``MLflowRegisterOperator`` registers the model and sets ``@champion``; the test then loads
``models:/<name>@champion`` with the same login. The password must reach the job's processes and
nothing else: not the job's entrypoint, its info in the Jobs API (``GET /api/jobs/<id>``), its log,
the tasks' XComs or the task log (the operators' log events, captured before Airflow's masking).

Refusals: an anonymous connection and a wrong password fail the task at once (no retries), with a
message that names the connection, before any job is submitted; a job that reaches MLflow without
credentials ends as an input error that says so; a user without permission is told it lacks it.

The task context is the small stand-in of ``test_ray_jobs`` (``execute()`` called directly).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from emr_ray.cluster import partitions
from emr_ray.exceptions import MLflowAuthError
from emr_ray.hooks.mlflow import MLflowHook
from emr_ray.hooks.ray import RayHook
from emr_ray.identity import TaskIdentity
from emr_ray.operators.mlflow import MLflowRegisterOperator
from emr_ray.operators.torch import TorchTrainOperator
from tests.fixtures.mlflow import AuthMLflowServer, use_tracking_uri
from tests.fixtures.ray import ray_connection_json
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration

CONN = "mlflow_auth"
MODEL = "auth-mlp"
EXPERIMENT = "auth-e2e"
PARTITION = "2026-11-07"
FEATURES = [f"f{i:02d}" for i in range(16)]
CONFIG = {"feature_columns": FEATURES, "label_column": "label", "epochs": 2, "batch_size": 64}


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> partitions.Committed:
    """A tiny committed, standardized partition: 400 training and 100 test rows."""
    import pyarrow as pa

    from include.data.synthetic import make_partition

    root = tmp_path_factory.mktemp("auth_staged")
    table = make_partition(PARTITION, 500)
    for c in FEATURES:
        values = table[c].to_numpy()
        scaled = pa.array(((values - values.mean()) / values.std()).astype("float32"))
        table = table.set_column(table.schema.get_field_index(c), c, scaled)
    rows = {"train": table.slice(0, 400), "test": table.slice(400)}
    return partitions.write_tables(f"file://{root}/tabular/dt={PARTITION}", rows, {"partition": PARTITION})


@pytest.fixture(scope="module")
def conns(mlflow_auth_server: AuthMLflowServer, ray_cluster) -> Iterator[AuthMLflowServer]:
    """``ray_default`` on the session's head; ``mlflow_auth`` logged in as the ordinary user; other
    ``mlflow_*`` connections anonymous, with a wrong password, and as the admin."""
    server = mlflow_auth_server
    user, password = server.user
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_connection_json(ray_cluster))
        env.setenv(f"AIRFLOW_CONN_{CONN.upper()}", server.connection(user, password))
        env.setenv("AIRFLOW_CONN_MLFLOW_ANON", server.connection())
        env.setenv("AIRFLOW_CONN_MLFLOW_WRONG", server.connection(user, password + "-wrong"))
        env.setenv("AIRFLOW_CONN_MLFLOW_ADMIN", server.connection(*server.admin))
        yield server


def train_op(staged: partitions.Committed, storage: Path, conn_id: str = CONN) -> TorchTrainOperator:
    return TorchTrainOperator(
        task_id="train",
        train_loop="include.models.tabular:train_loop",
        datasets={n: staged.output_uri(n) for n in ("train", "test")},
        storage_path=f"file://{storage}",
        config=CONFIG,
        num_workers=1,
        mlflow_conn_id=conn_id,
        experiment_name=EXPERIMENT,
        poll_interval=0.5,
    )


@dataclass
class Flow:
    """What the end-to-end flow left: the tasks' results, XComs and log events, and the job's id."""

    trained: dict[str, Any]
    registered: dict[str, Any]
    xcoms: dict[str, Any]
    log: str
    submission_id: str


@pytest.fixture(scope="module")
def flow(conns: AuthMLflowServer, staged, tmp_path_factory: pytest.TempPathFactory) -> Flow:
    """Train on the cluster, then register and promote, both as the ordinary user."""
    train_ti, register_ti = FakeTaskInstance("train"), FakeTaskInstance("register")
    train = train_op(staged, tmp_path_factory.mktemp("auth_checkpoints"))
    register = MLflowRegisterOperator(
        task_id="register", model_name=MODEL, run_id="", mlflow_conn_id=CONN, emit_asset=False
    )
    with capture_logs() as events:
        trained = train.execute({"ti": train_ti, "ds": PARTITION})  # type: ignore[arg-type]
        register.run_id = trained["mlflow_run_id"]
        registered = register.execute({"ti": register_ti, "ds": PARTITION})  # type: ignore[arg-type]
    assert train._submission_id is not None
    log = "\n".join(f"{e.get('log_level')} {e.get('event')} {e.get('exc_info') or ''}" for e in events)
    return Flow(
        trained=trained,
        registered=registered,
        xcoms={"train": train_ti.xcom, "register": register_ti.xcom},
        log=log,
        submission_id=train._submission_id,
    )


def client(server: AuthMLflowServer):
    import mlflow

    return mlflow.MlflowClient(server.tracking_uri)


# ---------------------------------------------------------------------- the flow, on data
def test_the_training_run_has_every_epochs_metrics(conns: AuthMLflowServer, flow: Flow) -> None:
    with conns.logged_in(*conns.user):
        mlflow_client = client(conns)
        run = mlflow_client.get_run(flow.trained["mlflow_run_id"])
        history = mlflow_client.get_metric_history(run.info.run_id, "test_loss")
        accuracy = mlflow_client.get_metric_history(run.info.run_id, "test_accuracy")
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in history) == sorted(m.step for m in accuracy) == [0, 1]
    assert run.data.params["epochs"] == "2" and run.data.params["scaling.num_workers"] == "1"
    assert run.data.metrics["final_test_accuracy"] == pytest.approx(
        flow.trained["final_metrics"]["test_accuracy"]
    )
    assert flow.trained["epochs_completed"] == 2 and flow.trained["rows"] == {"train": 400, "test": 100}


def test_the_version_is_registered_with_its_tags_and_is_champion(conns: AuthMLflowServer, flow: Flow) -> None:
    registered = flow.registered
    assert registered["version"] == "1" and registered["promoted"] is True
    assert registered["aliases"] == ["challenger", "champion"]
    with conns.logged_in(*conns.user):
        version = client(conns).get_model_version_by_alias(MODEL, "champion")
    assert version.version == "1" and version.run_id == flow.trained["mlflow_run_id"]
    assert version.tags["partition"] == PARTITION
    assert version.tags["airflow.dag_id"] == "tests" and version.tags["airflow.task_id"] == "register"
    assert version.tags["artifact_path"] == "model"


def test_champion_loads_and_predicts_with_the_login_and_not_without(
    conns: AuthMLflowServer, flow: Flow
) -> None:
    import mlflow
    import numpy as np
    from mlflow.exceptions import MlflowException

    with use_tracking_uri(conns.tracking_uri):
        with conns.logged_in(*conns.user):
            model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
        predictions = np.asarray(model.predict(np.zeros((4, len(FEATURES)), dtype=np.float32)))
        assert predictions.shape == (4, 2)
        with pytest.raises(MlflowException, match="401") as refused:
            mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    assert refused.value.error_code == "UNAUTHENTICATED"


def test_the_registry_links_and_reads_use_the_login(conns: AuthMLflowServer, flow: Flow) -> None:
    hook = MLflowHook(CONN)
    assert hook.get_aliases(MODEL) == {"champion": "1", "challenger": "1"}
    assert hook.get_metric_of_run(flow.trained["mlflow_run_id"], "test_accuracy") is not None
    assert hook.test_connection() == (True, f"Connected to MLflow at {conns.tracking_uri}")
    link = flow.xcoms["register"]["_link_MLflowModelVersionLink"]
    assert link == f"{conns.tracking_uri}/#/models/{MODEL}/versions/1"


# ---------------------------------------------------------------------- where the password is not
def test_the_password_is_not_in_the_entrypoint_job_log_xcoms_or_task_log(
    conns: AuthMLflowServer, flow: Flow
) -> None:
    password = conns.user[1]
    job = RayHook().get_job(flow.submission_id)
    assert job is not None and job["status"] == "SUCCEEDED"
    assert password not in job["entrypoint"]
    assert password not in RayHook().get_job_logs(flow.submission_id)
    assert password not in json.dumps([flow.trained, flow.registered, flow.xcoms], default=str)
    assert "epoch 2/2" in flow.log, flow.log[-2000:]  # the capture holds the job's log as streamed
    assert password not in flow.log


def test_the_password_is_not_in_the_job_info_of_the_jobs_api(conns: AuthMLflowServer, flow: Flow) -> None:
    """``GET /api/jobs/<id>`` shows the runtime_env to anyone with the cluster's token: the login
    travels through the secret channel (``emr_ray.cluster.secrets``), not ``runtime_env.env_vars``."""
    job = RayHook().get_job(flow.submission_id)
    assert job is not None
    assert conns.user[1] not in json.dumps(job), json.dumps(job.get("runtime_env"))[:2000]


def test_a_warm_group_logs_and_compares_with_the_login_and_keeps_none_of_it(
    conns: AuthMLflowServer, flow: Flow, staged, tmp_path: Path
) -> None:
    """With ``worker_group="shared"`` the warm group's rank 0 does every MLflow step of the run: it
    starts the run, logs each epoch, logs the model and scores the champion (``jobs/train_finish.py``),
    ends the run, and after the lease logs the job's usage, each with the job's login, which reaches
    it with that call only (removed after it: ``tests/unit/jobs/test_train_group.py``; the usage's
    goes with its request alone) and shows in no job info or log."""
    op = train_op(staged, tmp_path)
    op.worker_group, op.compare_with_model = "shared", MODEL
    ti = FakeTaskInstance("train_warm")
    trained = op.execute({"ti": ti, "ds": PARTITION})  # type: ignore[arg-type]

    assert trained["worker_group"]["name"]
    comparison = trained["comparison"]
    assert comparison["champion_version"] == "1" and comparison["rows"] == 100, comparison
    assert set(comparison["champion"]) == set(comparison["challenger"]) >= {"test_accuracy"}
    with conns.logged_in(*conns.user):
        run = client(conns).get_run(trained["mlflow_run_id"])
        logged = client(conns).search_logged_models(experiment_ids=[run.info.experiment_id])
        history = client(conns).get_metric_history(run.info.run_id, "test_loss")
    assert run.info.status == "FINISHED" and run.data.tags["compare.champion_version"] == "1"
    assert sorted(m.step for m in history) == [0, 1] and run.data.params["epochs"] == "2"
    final = trained["final_metrics"]["test_accuracy"]
    assert (
        run.data.metrics["final_test_accuracy"] == pytest.approx(final)
        and run.data.metrics["fit_seconds"] > 0
    )
    assert run.data.metrics["usage.wall_seconds"] == pytest.approx(trained["usage"]["wall_seconds"])
    assert [m.name for m in logged if m.source_run_id == run.info.run_id] == ["model"]
    job, logs = RayHook().get_job(op._submission_id), RayHook().get_job_logs(op._submission_id)
    assert conns.user[1] not in json.dumps(job) + logs
    # the champion, a model from the registry, was scored in a process that ended with the call
    assert re.search(r"compare:score_rows ran in process \d+, which has ended \(\d+\.\ds\)", logs), logs


# ---------------------------------------------------------------------- refusals
def test_an_anonymous_connection_is_refused_at_once_naming_it(conns: AuthMLflowServer, flow: Flow) -> None:
    register = MLflowRegisterOperator(
        task_id="register", model_name=MODEL, run_id=flow.trained["mlflow_run_id"],
        mlflow_conn_id="mlflow_anon", emit_asset=False,
    )  # fmt: skip
    started = time.monotonic()
    with pytest.raises(MLflowAuthError, match=r"requires a login and the connection has none") as refused:
        register.execute({"ti": FakeTaskInstance("register"), "ds": PARTITION})  # type: ignore[arg-type]
    assert time.monotonic() - started < 10, "a 401 was retried"
    assert "connection 'mlflow_anon', 401" in str(refused.value)
    ok, message = MLflowHook("mlflow_anon").test_connection()
    assert not ok and "requires a login" in message


def test_a_wrong_password_fails_the_training_before_any_job_naming_the_connection(
    conns: AuthMLflowServer, staged, tmp_path: Path
) -> None:
    ti = FakeTaskInstance("train")
    started = time.monotonic()
    with pytest.raises(MLflowAuthError, match=r"refused user 'trainer': the connection's login or password is wrong") as refused:  # fmt: skip
        train_op(staged, tmp_path, "mlflow_wrong").execute({"ti": ti, "ds": PARTITION})  # type: ignore[arg-type]
    assert time.monotonic() - started < 10, "a 401 was retried"
    assert "(connection 'mlflow_wrong', 401)" in str(refused.value)
    assert conns.user[1] not in str(refused.value)
    identity = TaskIdentity(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number)
    assert RayHook().get_job(identity.submission_id()) is None, "a job was submitted"


def test_a_job_without_credentials_ends_as_an_input_error_that_says_so(
    conns: AuthMLflowServer, staged, tmp_path: Path
) -> None:
    """The job's own MLflow step, run in this process with no credentials in its environment (as on a
    cluster where the secrets did not arrive): exit 2, no retry, and what to fix."""
    from emr_ray.cluster.jobs import train_mlflow
    from emr_ray.cluster.jobs._runtime import JobInputError

    ti = FakeTaskInstance("train")
    op = train_op(staged, tmp_path)
    spec = op.build_spec({"ti": ti, "ds": PARTITION}, TaskIdentity.from_context({"ti": ti}))
    with pytest.raises(
        JobInputError, match=r"refused the training job \(401\) with no credentials: set login"
    ):
        train_mlflow.start_run(spec, None)
    with (
        conns.logged_in(conns.user[0], "wrong"),
        pytest.raises(JobInputError, match="with user 'trainer': fix"),
    ):
        train_mlflow.start_run(spec, None)


def test_a_user_without_permission_is_told_so(conns: AuthMLflowServer) -> None:
    """``default_permission = NO_PERMISSIONS``: the admin's own experiment is closed to the ordinary user."""
    admin = MLflowHook("mlflow_admin")
    experiment_id = admin.get_or_create_experiment("admin-only")
    with admin.credentials():
        run_id = admin.client.create_run(experiment_id).info.run_id
    with pytest.raises(
        MLflowAuthError, match=r"denied user 'trainer' of connection 'mlflow_auth' permission"
    ):
        MLflowHook(CONN).get_run(run_id)
