"""Housekeeping against the real model registry and the COS stand-in: what a model version names stays.

Issue 31, item 1: counting commits removed the champion's generation after a few reruns. Here a
partition is rerun four times; the registry (a real MLflow store) has a live version trained on the
first generation (through its training's pin) and one whose tags name the third; a training that
registered nothing pinned the second. With no retention period left, housekeeping removes exactly
the second (and its pin), first as a dry run that removes nothing, through the operator's code path
and the command line, and the generations the versions name still read whole.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devstack.constants import BUCKET, REGION, SECRET_ID, SECRET_KEY
from emr_ray.cluster import partitions, retention, storage
from emr_ray.housekeeping import housekeep, main

pytestmark = pytest.mark.integration

MODEL = f"housekept-{uuid.uuid4().hex[:6]}"


def rows_of(committed: partitions.Committed, options: storage.StorageOptions) -> list[int]:
    fsys = storage.filesystem(committed.partition_uri, options)
    files = partitions.dataset_files(committed, "train", options)
    return [v for path, _ in files for v in pq.read_table(path, filesystem=fsys).column("x").to_pylist()]


def test_housekeeping_keeps_what_live_model_versions_name_and_releases_the_rest(
    cos_server, cos_conn, mlflow_conn, capsys
):
    import mlflow

    options = storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                     access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    dataset = f"cos://{BUCKET}/kept-{uuid.uuid4().hex[:8]}/staging/tabular"
    partition = f"{dataset}/dt=2026-11-02"
    made = [
        partitions.write_tables(partition, {"train": pa.table({"x": [i] * 5})}, {}, options) for i in range(4)
    ]

    client = mlflow.MlflowClient(mlflow_conn.tracking_uri)
    experiment = client.create_experiment(
        f"exp-{MODEL}", artifact_location=f"{mlflow_conn.artifact_root}/{MODEL}"
    )
    registered, unregistered, tagged = (client.create_run(experiment).info.run_id for _ in range(3))
    client.create_registered_model(MODEL)
    client.create_model_version(
        MODEL, f"runs:/{registered}/model", run_id=registered
    )  # its pin keeps made[0]
    client.create_model_version(MODEL, f"runs:/{tagged}/model", run_id=tagged,
                                tags={"data_uri": partition, "generation": made[2].generation})  # fmt: skip
    for committed, run_id in ((made[0], registered), (made[1], unregistered)):
        retention.pin(partition, committed.generation, f"train-{run_id}", options, kind="training",
                      mlflow_run_id=run_id)  # fmt: skip

    policy = retention.Policy(keep=1, retain_s=0)
    dry = housekeep([dataset], [MODEL], policy=policy)
    assert [(r.kind, r.name) for r in dry.planned] == [
        ("pin", f"{made[1].generation}/train-{unregistered}"),
        ("generation", made[1].generation),
    ]
    assert dry.as_xcom()["removed"] == 0 and partitions.pinned(partition, made[1].generation, options)

    assert main(["sweep", dataset, "--model", MODEL, "--retain-days", "0", "--keep", "1"]) == 0  # dry too
    printed = capsys.readouterr().out
    assert f"Would remove generation {made[1].generation} of {partition}: superseded" in printed
    assert "Would remove 2 item(s) (dry run: add --apply)" in printed
    assert partitions.pinned(partition, made[1].generation, options)

    done = housekeep([dataset], [MODEL], policy=policy, dry_run=False)
    assert done.as_xcom()["removed"] == 2 and not done.failed
    with pytest.raises(storage.StorageError, match="removed by retention"):
        partitions.pinned(partition, made[1].generation, options)
    for i in (0, 2, 3):  # what the versions name, and the current generation, read whole
        assert rows_of(partitions.pinned(partition, made[i].generation, options), options) == [i] * 5
    assert [p.generation for p in retention.pins(partition, options)] == [made[0].generation]
