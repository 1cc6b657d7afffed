"""An arrival event is delivered at least once: a duplicate for a partition already trained on with the
same raw listing starts nothing; the same partition landed again, with other files, runs.

Against a real MLflow store (SQLite) and raw partitions on ``file://``; the identity of a listing is the
one the preprocessing records (:mod:`emr_ray.hooks.input_identity`).
"""

from __future__ import annotations

import logging
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from emr_ray.arrivals import RAW_INPUT_TAG, trained_on, unprocessed
from emr_ray.hooks.input_identity import partition_identity

IDENTITY = "3 files, 81,234 bytes, _SUCCESS of 2026-12-04T10:00:00+00:00, listing 1a2b3c4d5e6f"


def test_only_a_version_trained_on_exactly_this_listing_counts():
    versions = [("2", {RAW_INPUT_TAG: IDENTITY}), ("1", {RAW_INPUT_TAG: "other listing"}), ("3", {})]
    assert trained_on(IDENTITY, versions) == "2"
    assert trained_on("4 files, other", versions) is None
    assert trained_on("no files", [("1", {RAW_INPUT_TAG: "no files"})]) is None  # nothing landed yet
    assert trained_on("unreadable: OSError", [("1", {RAW_INPUT_TAG: "unreadable: OSError"})]) is None
    assert trained_on(None, versions) is None


def land(root, partition: str, rows: int) -> str:
    folder = root / "raw" / f"dt={partition}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": list(range(rows))}), folder / f"part-{rows}.parquet")
    (folder / "_SUCCESS").touch()
    return f"file://{folder}"


def test_a_duplicate_arrival_of_the_same_listing_runs_nothing_and_a_new_landing_runs(
    mlflow_conn, tmp_path, caplog
):
    import mlflow

    model = f"arrivals-{uuid.uuid4().hex[:6]}"
    raw = f"file://{tmp_path}/raw"
    done, fresh = "2026-12-01", "2026-12-02"
    client = mlflow.MlflowClient(mlflow_conn.tracking_uri)
    run_id = client.create_run(client.create_experiment(f"exp-{model}")).info.run_id
    client.create_registered_model(model)
    identity = partition_identity(land(tmp_path, done, 40))
    client.create_model_version(model, f"runs:/{run_id}/model", run_id=run_id,
                                tags={"partition": done, RAW_INPUT_TAG: identity})  # fmt: skip
    land(tmp_path, fresh, 40)
    confs = [{"partition": done}, {"partition": fresh}, {"partition": done, "force_recompute": True}]

    log = logging.getLogger("test.arrivals")
    with caplog.at_level(logging.INFO, logger="test.arrivals"):
        kept = unprocessed(confs, raw, model, cos_conn_id="unused", mlflow_conn_id="mlflow_default", log=log)
    assert kept == [{"partition": fresh}, {"partition": done, "force_recompute": True}]
    assert f"{model} v1 was trained on exactly this raw listing" in caplog.text

    land(tmp_path, done, 7)  # landed again under the same URI, with another file
    assert unprocessed(
        confs[:1], raw, model, cos_conn_id="unused", mlflow_conn_id="mlflow_default", log=log
    ) == [{"partition": done}]
