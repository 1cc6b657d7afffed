"""TorchTrainOperator resumes instead of restarting, on the real local Ray cluster and MLflow store.

Three interruptions: a worker process dies (the worker group restarts from the checkpoint,
FailureConfig) and then the Airflow side is killed mid-training and the task is retried (the job of
try 1 is stopped, try 2 resumes from the latest checkpoint into the same MLflow run); both run with
Ray Train's worker group (``worker_group="job"``) and with a warm one (``"shared"``: a killed worker
retires its group and a fresh one resumes; the stopped job's lease ends and its group is retired).
Third, a job's driver is killed outright while its warm call runs: the retry waits for the
abandoned call's group to retire before it trains the run. Every run must end with exactly the
configured number of epochs. COS (the stand-in) throttling and answering late while checkpoints are
uploaded is ridden out by both groups. The Airflow task context is the small stand-in from
``test_ray_jobs``; Ray, Ray Train and MLflow are real.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from emr_ray.cluster import partitions, storage
from emr_ray.hooks.ray import RayHook
from emr_ray.identity import TaskIdentity
from emr_ray.operators.torch import TorchTrainOperator
from tests.integration.test_ray_jobs import FakeTaskInstance, wait_for

pytestmark = pytest.mark.integration
EPOCHS = 6


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> partitions.Committed:
    """A committed, already standardized partition (written with pyarrow: no Spark needed here)."""
    import pyarrow as pa

    from include.data.synthetic import FEATURE_COLUMNS, make_partition

    root = tmp_path_factory.mktemp("staged")
    final = f"file://{root}/tabular/dt=2026-11-05"
    table = make_partition("2026-11-05", 12000)
    columns = {c: table[c].to_numpy() for c in FEATURE_COLUMNS}
    for c, values in columns.items():
        scaled = pa.array(((values - values.mean()) / values.std()).astype("float32"))
        table = table.set_column(table.schema.get_field_index(c), c, scaled)
    rows = {"train": table.slice(0, 10000), "test": table.slice(10000)}
    return partitions.write_tables(final, rows, {"partition": "2026-11-05"})


def make_operator(
    staged: partitions.Committed, checkpoints: Path, config_overrides: dict | None = None, **kwargs
) -> TorchTrainOperator:
    from include.data.synthetic import FEATURE_COLUMNS

    return TorchTrainOperator(
        task_id="train",
        train_loop="include.models.tabular:train_loop",
        datasets={name: staged.output_uri(name) for name in ("train", "test")},
        storage_path=f"file://{checkpoints}",
        config={
            "feature_columns": FEATURE_COLUMNS,
            "label_column": "label",
            "epochs": EPOCHS,
            "batch_size": 32,
        }
        | (config_overrides or {}),
        experiment_name="resume-tests",
        poll_interval=0.5,
        **({"num_workers": 2} | kwargs),
    )


def wait_for_reported_epoch(run_dir: Path, tracking_uri: str, timeout: float = 300) -> None:
    """Block until Ray Train has registered a checkpoint: its epoch's metrics reached MLflow."""
    import json

    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"no epoch was reported under {run_dir}"
        state = run_dir / "_emr_ray_state.json"
        if state.exists() and list(run_dir.glob("checkpoint_*")):
            run_id = json.loads(state.read_text())["mlflow_run_id"]
            if epochs_logged(tracking_uri, run_id):
                return
        time.sleep(0.5)


def epochs_logged(tracking_uri: str, run_id: str) -> list[int]:
    import mlflow

    history = mlflow.MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, "test_accuracy")
    return sorted({m.step for m in history})


#: the worker actors' class for each worker_group
WORKER_CLASS = {"job": "RayTrainWorker", "shared": "TrainWorker"}


def train_worker_pids(hook: RayHook, class_name: str = "RayTrainWorker") -> list[int]:
    """PIDs of this session's cluster's live training workers (its state API; never another cluster's)."""
    params = {"filter_keys": "state", "filter_predicates": "=", "filter_values": "ALIVE", "detail": "true"}
    response = hook._request("GET", "/api/v0/actors", params=params)
    assert response is not None
    actors = response.json()["data"]["result"]["result"]
    return sorted(a["pid"] for a in actors if a.get("class_name") == class_name and a.get("pid"))


def logged_start_epochs(tracking_uri: str, run_id: str) -> list[int]:
    """The ``start_epoch`` each reported epoch's attempt began at (> 0: it resumed from a checkpoint)."""
    import mlflow

    history = mlflow.MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, "start_epoch")
    return [int(m.value) for m in sorted(history, key=lambda m: m.step)]


@pytest.mark.parametrize("worker_group", ["job", "shared"])
def test_a_killed_worker_and_then_an_airflow_retry_each_resume_from_the_latest_checkpoint(
    ray_conn, mlflow_conn, staged, tmp_path, worker_group
):
    """Two interruptions of one training. A worker process dies: the group restarts from its latest
    checkpoint (Ray Train's FailureConfig; a warm group is retired and a fresh one resumes) and
    reports on. Then the Airflow side is killed and the task retried: the job of try 1 is stopped,
    try 2 resumes from the latest checkpoint into the same MLflow run, which ends with every epoch.
    A third try reattaches to try 2's finished job. Enough epochs that both land in the loop."""
    epochs = 2 * EPOCHS
    hook = RayHook(ray_conn)
    first = FakeTaskInstance("train", try_number=1)
    op = make_operator(staged, tmp_path, {"epochs": epochs}, max_failures=2, worker_group=worker_group)
    identity = TaskIdentity.from_context({"ti": first})
    run_dir = Path(identity.checkpoint_path(str(tmp_path))) / identity.run_name
    op._submission_id = op._reattach_or_submit(identity, op.job_payload({"ds": "2026-11-05"}, identity), {})
    wait_for_reported_epoch(run_dir, mlflow_conn.tracking_uri)
    pids = train_worker_pids(hook, WORKER_CLASS[worker_group])
    assert pids, "no training worker process found"
    os.kill(pids[0], signal.SIGKILL)

    run_id = json.loads((run_dir / "_emr_ray_state.json").read_text())["mlflow_run_id"]
    deadline = time.monotonic() + 300
    while not any(logged_start_epochs(mlflow_conn.tracking_uri, run_id)):  # an epoch of the resumed group
        assert hook.get_job(op._submission_id)["status"] == "RUNNING", "the job ended after a worker died"
        assert time.monotonic() < deadline, "no epoch was reported after the worker died"
        time.sleep(0.5)
    op.on_kill()  # the Airflow worker was killed: its job is stopped, nothing is left running
    assert wait_for(hook, op._submission_id, {"STOPPED", "FAILED", "SUCCEEDED"}) == "STOPPED"
    restarted_at = max(logged_start_epochs(mlflow_conn.tracking_uri, run_id))

    retry = FakeTaskInstance("train", try_number=2, run_id=first.run_id)
    result = make_operator(
        staged, tmp_path, {"epochs": epochs}, max_failures=2, worker_group=worker_group
    ).execute({"ti": retry, "ds": "2026-11-05"})
    assert result["mlflow_run_id"] == run_id and result["epochs_completed"] == epochs
    assert result["final_metrics"]["start_epoch"] > restarted_at, "the retry did not resume from the latest"
    assert epochs_logged(mlflow_conn.tracking_uri, run_id) == list(range(epochs))
    third = FakeTaskInstance("train", 3, first.run_id)
    again = make_operator(
        staged, tmp_path, {"epochs": epochs}, max_failures=2, worker_group=worker_group
    ).execute({"ti": third, "ds": "2026-11-05"})
    assert again == result  # reattached to try 2's finished job: nothing trained again
    assert hook.get_job(TaskIdentity.from_context({"ti": third}).submission_id()) is None


def test_a_warm_group_that_lost_a_worker_while_idle_is_never_leased_again(
    ray_conn, mlflow_conn, staged, tmp_path
):
    """A warm group's worker dies between two trainings (an OOM kill, a lost node): the next training
    is not handed the broken group, so it runs in a fresh one without spending a failure
    (``max_failures=0``), and its model is logged on the fresh group's rank 0 as usual."""
    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    first = make_operator(staged, tmp_path, {"epochs": 1}, worker_group="shared").execute(
        {"ti": FakeTaskInstance("train_before", run_id=run_id)}
    )
    hook = RayHook(ray_conn)
    for pid in train_worker_pids(hook, WORKER_CLASS["shared"]):  # every idle group loses its workers
        os.kill(pid, signal.SIGKILL)
    op = make_operator(staged, tmp_path, {"epochs": 1}, max_failures=0, worker_group="shared")
    after = op.execute({"ti": FakeTaskInstance("train_after", run_id=run_id)})
    assert after["epochs_completed"] == 1 and not after["worker_group"]["reused"]
    assert after["worker_group"]["calls"] == 1, "a group that lost a worker served another call"
    assert first["mlflow_run_id"] != after["mlflow_run_id"]
    logs = hook.get_job_logs(op._submission_id)
    assert "lost a worker while idle; retiring it" in logs and "restarting from the latest" not in logs
    assert "driver logs the model" not in logs  # the fresh group's rank 0 logged it


def test_a_retry_after_its_job_driver_was_killed_waits_for_the_abandoned_warm_call_then_resumes(
    ray_conn, mlflow_conn, staged, tmp_path
):
    """The job's driver is SIGKILLed (an OOM kill, a lost node: no ``finally`` runs) while its loop
    runs in a warm group: the call runs on without it until its lease lapses. An immediate retry
    must not train the same run meanwhile (two writers of its checkpoints, epochs no driver logged):
    it waits for the abandoned group to retire, then resumes, and every epoch is in MLflow once.
    Enough epochs that the abandoned call still writes checkpoints when the retry starts."""
    from tests.integration.test_train_group import live_groups

    epochs = 30
    hook = RayHook(ray_conn)
    first = FakeTaskInstance("train", try_number=1)
    op = make_operator(staged, tmp_path, {"epochs": epochs}, worker_group="shared")
    identity = TaskIdentity.from_context({"ti": first})
    op._submission_id = op._reattach_or_submit(identity, op.job_payload({"ds": "2026-11-05"}, identity), {})
    wait_for_reported_epoch(
        Path(identity.checkpoint_path(str(tmp_path))) / identity.run_name, mlflow_conn.tracking_uri
    )
    abandoned = live_groups(hook, "actor_id")  # a fresh group may take the same name
    os.kill(int(hook.get_job(op._submission_id)["driver_info"]["pid"]), signal.SIGKILL)
    assert wait_for(hook, op._submission_id, {"STOPPED", "FAILED", "SUCCEEDED"}) == "FAILED"
    assert abandoned and set(abandoned) <= set(live_groups(hook, "actor_id")), "its group is gone already"

    retry = FakeTaskInstance("train", try_number=2, run_id=first.run_id)
    retry_op = make_operator(staged, tmp_path, {"epochs": epochs}, worker_group="shared")
    result = retry_op.execute({"ti": retry, "ds": "2026-11-05"})
    assert "still run a call on" in hook.get_job_logs(retry_op._submission_id)  # it waited
    assert not set(abandoned) & set(live_groups(hook, "actor_id")), "the abandoned group never retired"
    assert result["epochs_completed"] == epochs
    # the abandoned call's epochs too: their checkpoints were all written before the retry read them
    assert epochs_logged(mlflow_conn.tracking_uri, result["mlflow_run_id"]) == list(range(epochs))


def test_a_cleared_task_after_its_partition_was_recommitted_trains_on_the_new_data(
    ray_conn, mlflow_conn, staged, tmp_path
):
    """Clear-to-rerun never returns a stale model: the first try trained on generation A; the date
    is then recommitted (generation B, other rows) and the task cleared (a new try, whose rendered
    datasets point at B, as the DAG's XCom pull does). It must not reattach to A's finished job nor
    reuse A's stored result: it trains again, on B's rows."""
    first = FakeTaskInstance("train", try_number=1)
    context = {"ti": first, "ds": "2026-11-05"}
    # a warm group (what the DAGs use): the point is which data the cleared try trains on
    before = make_operator(staged, tmp_path, config_overrides={"epochs": 1}, worker_group="shared").execute(
        context
    )
    assert before["rows"]["train"] == 10000

    table = staged_table(staged)
    recommitted = partitions.write_tables(
        staged.partition_uri, {"train": table.slice(0, 6000), "test": table.slice(10000)}, {}
    )
    cleared = FakeTaskInstance("train", try_number=2, run_id=first.run_id)
    after = make_operator(
        recommitted, tmp_path, config_overrides={"epochs": 1}, worker_group="shared"
    ).execute({"ti": cleared, "ds": "2026-11-05"})
    assert after["rows"]["train"] == 6000 and not after.get("reused")
    assert after["mlflow_run_id"] != before["mlflow_run_id"]
    # issue 31, item 6: every checkpoint in the run's folder names the new inputs; A's are not kept
    run_folder = Path(after["checkpoint_uri"].removeprefix("file://")).parent
    assert Path(before["checkpoint_uri"].removeprefix("file://")).parent == run_folder
    named = [
        json.loads((d / "inputs.json").read_text())["fingerprint"] for d in run_folder.glob("checkpoint_*")
    ]
    assert named and len(set(named)) == 1
    assert RayHook(ray_conn).get_job(TaskIdentity.from_context({"ti": cleared}).submission_id()) is not None


def staged_table(committed: partitions.Committed):
    """Every row of a committed generation, train then test, as one table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = [p for name in ("train", "test") for p, _ in partitions.dataset_files(committed, name)]
    return pa.concat_tables([pq.read_table(path) for path in paths])


def test_cos_throttling_and_slow_answers_during_checkpoint_writes_do_not_break_training(
    ray_conn, mlflow_conn, cos_server, cos_conn, staged
):
    """Checkpoints to COS (the stand-in) while it answers 503 SlowDown and serves late: a warm group's
    uploads go through the provider's pyarrow filesystem, whose S3 client retries; the run completes,
    every epoch reaches MLflow once, and its best checkpoint is whole. Ray Train's own worker group
    (``worker_group="job"``) uploads through the same filesystem (``storage.filesystem``), so the same
    retries: not run twice."""
    from devstack.constants import BUCKET, REGION, SECRET_ID, SECRET_KEY

    storage_root = f"cos://{BUCKET}/ckpt-{uuid.uuid4().hex[:8]}"
    op = make_operator(
        staged, Path("/unused"), config_overrides={"epochs": 2}, num_workers=1, worker_group="shared"
    )
    op.storage_path = storage_root
    ti = FakeTaskInstance("train")
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.update(op.execute({"ti": ti, "ds": "2026-11-05"})))
    worker.start()
    bursts = 0  # bursts the job rode out: 3 throttled answers and 2 late ones in a row, then a clean one
    while worker.is_alive() and bursts < 4:
        cos_server.inject_faults(3, status=503, code="SlowDown")
        cos_server.inject_delays(2, 0.5)
        while cos_server.unserved_faults() and worker.is_alive():
            worker.join(timeout=0.1)
        seen = cos_server.requests_seen()
        # the next burst once a request went through: a lone request in its retry backoff would
        # otherwise meet burst after burst, an outage that the retry budget rightly does not hide
        while cos_server.requests_seen() == seen and worker.is_alive():
            worker.join(timeout=0.1)
        bursts += cos_server.requests_seen() > seen
    worker.join(timeout=600)
    cos_server.clear_faults()
    assert outcome.get("epochs_completed") == 2, outcome
    assert bursts >= 2, f"the job rode out {bursts} burst(s) of faults: too few to prove anything"
    assert epochs_logged(mlflow_conn.tracking_uri, outcome["mlflow_run_id"]) == [0, 1]
    options = storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                     access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    fsys, path = storage.resolve(outcome["checkpoint_uri"], options)
    with fsys.open_input_stream(f"{path}/state.pt") as f:
        assert len(f.read()) > 1000  # the weights, uploaded whole
