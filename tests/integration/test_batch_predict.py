"""Batch scoring on the cluster (``RayBatchPredictOperator``) on the real local Ray cluster, MLflow
store and COS stand-in: the rows of a committed generation, scored by one registered version on Ray
Data, committed as a predictions generation; a retry reattaches; a clear after a promotion scores
with the new champion; the scorers, where the registry's code runs, hold no key.

The DAG that uses it, on a live stack: ``test_retrain_tabular.py`` (``score_tabular``).
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from emr_ray.cluster import partitions, storage
from tests.fixtures.mlflow import log_torch_run
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration
FEATURES = ["f0", "f1", "f2", "f3"]
ROWS = 500
#: where a job's process holds its keys once it took them (``emr_ray.cluster.secrets.ensure_env``)
SECRET_VARIABLES = ("EMR_RAY_COS_SECRET_ID", "EMR_RAY_COS_SECRET_KEY", "MLFLOW_TRACKING_USERNAME",
                    "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")  # fmt: skip


def predict_and_look_for_keys(model: Any, batch: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The tabular step's prediction, and what this scorer process holds: a secret variable in its
    environment, or a read of storage fused into it (its process title names every fused step)."""
    import os

    from include.scoring.tabular import predict_batch

    with open("/proc/self/cmdline", "rb") as f:
        title = f.read().decode(errors="replace")
    held = [name for name in SECRET_VARIABLES if os.environ.get(name)] + (
        ["a read"] if "Read" in title else []
    )
    predicted = predict_batch(model, batch, config)
    return {**predicted, "scorer_holds": np.full(len(predicted["prediction"]), ", ".join(held))}


def register(store, model: str, seed: int) -> str:
    """A tiny torch model (4 features -> 2 classes) as a new version of ``model``, made champion."""
    import mlflow

    from emr_ray.hooks.mlflow import MLflowHook

    run_id = log_torch_run(store, experiment="scoring", test_accuracy=None, seed=seed, inputs=len(FEATURES))
    client = mlflow.MlflowClient(store.tracking_uri)
    if seed == 0:
        client.create_registered_model(model)
    source, model_id = MLflowHook().resolve_model_source(client.get_run(run_id), "model")
    version = client.create_model_version(model, source, run_id=run_id, model_id=model_id).version
    client.set_registered_model_alias(model, "champion", version)
    return str(version)


def test_a_generation_is_scored_on_the_cluster_reattached_on_retry_and_rescored_after_a_promotion(
    ray_conn, mlflow_conn, cos_server, cos_conn
):
    from devstack.constants import BUCKET, REGION, SECRET_ID, SECRET_KEY
    from emr_ray.operators.predict import RayBatchPredictOperator

    options = storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                     access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    root = f"cos://{BUCKET}/scoring-{uuid.uuid4().hex[:8]}"
    x = np.random.default_rng(0).normal(size=(ROWS, len(FEATURES)))
    rows = pa.table({**{c: x[:, i] for i, c in enumerate(FEATURES)}, "row": np.arange(ROWS)})
    staged = partitions.write_tables(f"{root}/tabular/dt=2026-11-05", {"test": rows}, {}, options)
    model = f"scorer-{uuid.uuid4().hex[:6]}"
    first_version = register(mlflow_conn, model, seed=0)

    def operator() -> RayBatchPredictOperator:
        return RayBatchPredictOperator(
            task_id="score", model_name=model, alias="champion", input_uri=staged.output_uri("test"),
            output_uri=f"{root}/predictions/dt=2026-11-05", partition="2026-11-05",
            predict="tests.integration.test_batch_predict:predict_and_look_for_keys", config={"feature_columns": FEATURES},
            num_workers=1, batch_size=128, poll_interval=0.5,
        )  # fmt: skip

    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    first = operator().execute({"ti": FakeTaskInstance("score", run_id=run_id)})
    assert (first["model_version"], first["rows"], first["input_generation"]) == (
        first_version,
        ROWS,
        staged.generation,
    )
    scored = partitions.pinned(first["output_uri"], first["generation"], options)
    table = read(scored, options)
    assert sorted(table.column("row").to_pylist()) == list(range(ROWS))  # every row, once
    assert set(table.column_names) == {*FEATURES, "row", "prediction", "scorer_holds"}
    assert set(table.column("prediction").to_pylist()) <= {0, 1}
    assert set(table.column("scorer_holds").to_pylist()) == {""}  # no key, no storage read, in any scorer

    retried = operator().execute({"ti": FakeTaskInstance("score", try_number=2, run_id=run_id)})
    assert retried["generation"] == first["generation"]  # the same job, taken over: nothing scored twice

    second_version = register(mlflow_conn, model, seed=1)  # a promotion, then the task is cleared
    cleared = operator().execute({"ti": FakeTaskInstance("score", try_number=3, run_id=run_id)})
    assert cleared["model_version"] == second_version != first_version
    assert cleared["generation"] != first["generation"] and cleared["rows"] == ROWS
    current = partitions.require_current(first["output_uri"], options)
    assert current.generation == cleared["generation"] and current.manifest["version"] == second_version


def read(committed: partitions.Committed, options: storage.StorageOptions) -> pa.Table:
    import pyarrow.parquet as pq

    fsys = storage.filesystem(committed.partition_uri, options)
    files = [path for path, _ in partitions.dataset_files(committed, "predictions", options)]
    return pa.concat_tables([pq.read_table(path, filesystem=fsys) for path in files])
