"""Housekeeping against the real model registry: what a kept model version was trained on stays, without
any list of models, and an answer the registry cannot give completely removes no committed data.

Issue 52. Each test ages the pins the way days passing would (the store's clock: files' modification
times on ``file://``, a retention period of 0 on the COS stand-in) and asserts that the generation a
kept version was trained on still reads whole, with its rows, after housekeeping ran with ``--apply``.
"""

from __future__ import annotations

import os
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devstack.constants import BUCKET, REGION, SECRET_ID, SECRET_KEY
from devstack.fault_proxy import FaultProxy
from devstack.ports import free_port
from emr_ray.audit import sources
from emr_ray.audit.rules import check_versions
from emr_ray.cluster import partitions, retention, storage
from emr_ray.cluster.model_retention import VersionPolicy
from emr_ray.hooks.mlflow import MLflowHook
from emr_ray.housekeeping import housekeep, main

pytestmark = pytest.mark.integration

DAY = 86400
#: versions keep their data only while they hold an alias or are the newest (no grace by age)
STRICT = retention.Policy(keep=1, retain_s=0, versions=VersionPolicy(keep_newest=1, keep_days=0))


def rows_of(committed: partitions.Committed, options: storage.StorageOptions | None) -> list[int]:
    fsys = storage.filesystem(committed.partition_uri, options)
    files = partitions.dataset_files(committed, "train", options)
    return [v for path, _ in files for v in pq.read_table(path, filesystem=fsys).column("x").to_pylist()]


def reruns(
    partition: str, n: int, options: storage.StorageOptions | None = None
) -> list[partitions.Committed]:
    return [
        partitions.write_tables(partition, {"train": pa.table({"x": [i] * 5})}, {}, options) for i in range(n)
    ]


def train_pin(partition: str, committed: partitions.Committed, run_id: str, options=None) -> None:
    """The pin a training job writes for its input, with its MLflow run."""
    retention.pin(partition, committed.generation, f"train-{run_id}", options, kind="training",
                  mlflow_run_id=run_id)  # fmt: skip


def register(client, hook: MLflowHook, model: str, run_id: str, tags: dict | None = None) -> str:
    """A version registered as ``MLflowRegisterOperator`` registers it: the run names the model first."""
    hook.record_registration(run_id, dict(client.get_run(run_id).data.tags), model)
    return client.create_model_version(model, f"runs:/{run_id}/model", run_id=run_id, tags=tags).version


def age_pins(partition: str, days: float) -> None:
    then = time.time() - days * DAY
    for folder, _, files in os.walk(f"{storage.split_uri(partition)[1]}/{partitions.PINS}"):
        for name in files:
            os.utime(f"{folder}/{name}", (then, then))


def test_a_champion_no_list_names_keeps_its_data_through_a_rename_and_the_rest_goes(
    cos_server, cos_conn, mlflow_conn, capsys
):
    """Findings 1 and 3: a model the housekeeping is told nothing about (``tabular-gbm``), its old
    version holding ``@champion``; two newer versions the policy no longer keeps and a training that
    registered nothing. Renamed afterwards, the champion's data still stays."""
    import mlflow

    options = storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                     access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    dataset = f"cos://{BUCKET}/kept-{uuid.uuid4().hex[:8]}/staging/tabular"
    partition = f"{dataset}/dt=2026-11-02"
    made = reruns(partition, 5, options)
    model = f"tabular-gbm-{uuid.uuid4().hex[:6]}"
    client = mlflow.MlflowClient(mlflow_conn.tracking_uri)
    experiment = client.create_experiment(
        f"exp-{model}", artifact_location=f"{mlflow_conn.artifact_root}/{model}"
    )
    runs = [client.create_run(experiment).info.run_id for _ in range(4)]
    client.create_registered_model(model)
    hook = MLflowHook()
    lineage = {"data_uri": partition, "generation": made[0].generation}  # as the shipped DAGs tag versions
    champion = register(client, hook, model, runs[0], lineage)
    for run_id in (runs[1], runs[3]):
        register(client, hook, model, run_id)  # runs[2] trained and registered nothing
    client.set_registered_model_alias(model, "champion", champion)
    for committed, run_id in zip(made, runs, strict=False):
        train_pin(partition, committed, run_id, options)

    dry = housekeep([dataset], policy=STRICT)
    assert sorted((r.kind, r.name) for r in dry.planned) == sorted([
        ("pin", f"{made[1].generation}/train-{runs[1]}"),
        ("pin", f"{made[2].generation}/train-{runs[2]}"),
        ("generation", made[1].generation),
        ("generation", made[2].generation),
    ])  # fmt: skip
    why = {r.name: r.reason for r in dry.planned if r.kind == "pin"}
    assert why[f"{made[1].generation}/train-{runs[1]}"] == (
        f"no version registered from its MLflow run {runs[1]} ({model} v2) is kept by the policy any more"
    )
    assert (
        why[f"{made[2].generation}/train-{runs[2]}"]
        == f"its MLflow run {runs[2]} registered no model version"
    )
    kept = {k.generation: k.why for k in dry.kept}
    assert kept == {
        made[0].generation: "holds @champion",
        made[3].generation: f"among the newest 1 versions of {model}",
    }
    assert dry.as_xcom()["kept_bytes_by_model"][model] == sum(
        f["size"] for c in (made[0], made[3]) for f in c.outputs["train"]["files"]
    )
    assert dry.as_xcom()["removed"] == 0 and partitions.pinned(partition, made[1].generation, options)

    client.rename_registered_model(model, f"{model}-renamed")  # the run's tag names the old name now
    args = [
        "sweep",
        dataset,
        "--retain-days",
        "0",
        "--keep",
        "1",
        "--keep-versions",
        "1",
        "--keep-version-days",
        "0",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"Kept: {model}-renamed v{champion} (holds @champion) keeps {made[0].generation}" in printed
    assert "Would remove 4 item(s) (dry run: add --apply)" in printed

    assert main([*args, "--apply"]) == 0
    for gone in (made[1], made[2]):
        with pytest.raises(storage.StorageError, match="removed by retention"):
            partitions.pinned(partition, gone.generation, options)
    for i in (0, 3, 4):  # the champion's data, the newest version's, and the current generation, whole
        assert rows_of(partitions.pinned(partition, made[i].generation, options), options) == [i] * 5

    # the audit (python -m emr_ray.audit) agrees, and fails once the champion's files go behind its manifest
    states, _ = sources.version_states("mlflow_default", f"{model}-renamed", "x", options, STRICT.versions)
    assert [(s.version, s.kept, s.data_problem) for s in states if s.data_uri] == [
        (str(champion), True, None)
    ]
    [(path, _)] = partitions.dataset_files(
        partitions.pinned(partition, made[0].generation, options), "train", options
    )
    storage.filesystem(partition, options).delete_file(path)
    states, _ = sources.version_states("mlflow_default", f"{model}-renamed", "x", options, STRICT.versions)
    [lost] = [f for f in check_versions(states, ()) if "'s generation" in f.what]
    assert (
        f"v{champion}'s generation {made[0].generation}: output train: " in lost.what
        and "missing" in lost.what
    )


@pytest.mark.parametrize("fault", ["down", "slow"])
def test_mlflow_down_or_too_slow_removes_no_committed_data_and_says_why(
    fault, mlflow_server, tmp_path, monkeypatch
):
    """MLflow unreachable, or answering after 9 s through the fault proxy (past the client's timeout):
    the pass removes only what needs no registry, and the report says why."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    dataset = f"file://{tmp_path}/staging/tabular"
    partition = f"{dataset}/dt=2026-11-02"
    made = reruns(partition, 3)
    train_pin(partition, made[0], "a-run-mlflow-cannot-answer-for")
    age_pins(partition, 30)

    with FaultProxy(mlflow_server.tracking_uri) as proxy:
        url = f"http://127.0.0.1:{free_port()}" if fault == "down" else proxy.url
        proxy.set("delay", delay=9.0)
        monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", f'{{"conn_type": "mlflow", "host": "{url}"}}')
        report = housekeep([dataset], cos_conn_id=None, policy=STRICT, dry_run=False)
    assert report.planned == [] and report.as_xcom()["removed"] == 0
    assert report.problems and report.problems[0].startswith("the registry could not be listed (")
    assert [rows_of(partitions.pinned(partition, c.generation), None) for c in made] == [
        [0] * 5,
        [1] * 5,
        [2] * 5,
    ]


def test_a_login_that_may_not_read_the_champions_model_removes_nothing(
    mlflow_auth_server, tmp_path, monkeypatch
):
    """MLflow's auth app hides a model the login may not read from every search: the run names it, so
    its absence is a problem (grant READ), not a reason to remove the champion's data."""
    import mlflow

    server = mlflow_auth_server
    model = f"private-{uuid.uuid4().hex[:6]}"
    with server.logged_in(*server.user):  # the housekeeping login's own experiment and training run
        client = mlflow.MlflowClient(server.tracking_uri)
        run_id = client.create_run(client.create_experiment(f"exp-{model}")).info.run_id
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_ADMIN", server.connection(*server.admin))
    with server.logged_in(*server.admin):  # a model only the admin may read, its champion from that run
        client = mlflow.MlflowClient(server.tracking_uri)
        client.create_registered_model(model)
        version = register(client, MLflowHook(mlflow_conn_id="mlflow_admin"), model, run_id)
        client.set_registered_model_alias(model, "champion", version)
    dataset = f"file://{tmp_path}/staging/tabular"
    partition = f"{dataset}/dt=2026-11-02"
    made = reruns(partition, 3)
    train_pin(partition, made[0], run_id)
    age_pins(partition, 30)

    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", server.connection(*server.user))
    report = housekeep([dataset], cos_conn_id=None, policy=STRICT, dry_run=False)
    assert report.planned == []
    assert f"registered model {model!r} cannot be read with this login: grant it READ" in report.problems[0]
    assert rows_of(partitions.pinned(partition, made[0].generation), None) == [0] * 5

    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", server.connection(*server.admin))  # a login that may
    report = housekeep([dataset], cos_conn_id=None, policy=STRICT, dry_run=False)
    assert not report.problems and [(r.kind, r.name) for r in report.planned] == [
        ("generation", made[1].generation)
    ]
    assert [k.why for k in report.kept] == ["holds @champion"]
    assert rows_of(partitions.pinned(partition, made[0].generation), None) == [0] * 5
