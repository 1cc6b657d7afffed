"""Two preprocessing jobs at once on a cluster whose CPUs their Spark executors fill: both finish.

The session's head has 2 CPUs; each job's one executor holds one. The COS read and write go
through Ray Data, whose tasks must not wait for a CPU that no job will give back.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from devstack.constants import BUCKET, REGION, SECRET_ID, SECRET_KEY
from emr_ray.cluster import partitions, storage
from emr_ray.hooks.cos import COSHook
from emr_ray.operators.raydp import RayDPSparkOperator
from include.data.synthetic import FEATURE_COLUMNS, make_partition
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration
SCHEMA = {**dict.fromkeys(FEATURE_COLUMNS, "double"), "label": "int64"}


def test_two_cos_preprocessing_jobs_fill_the_cluster_and_both_finish(
    ray_conn, cos_server, cos_conn, cos_prefix
):
    import io

    import pyarrow.parquet as pq

    hook = COSHook(cos_conn)
    days = ["2026-11-01", "2026-11-02"]
    for day in days:
        buffer = io.BytesIO()
        pq.write_table(make_partition(day, 400), buffer)
        hook.upload_bytes(buffer.getvalue(), f"{cos_prefix}raw/dt={day}/part-00000.parquet")
        hook.upload_bytes(b"", f"{cos_prefix}raw/dt={day}/_SUCCESS")

    def run(day: str) -> dict:
        op = RayDPSparkOperator(
            task_id=f"preprocess_{day}",
            preprocess="include.preprocessing.tabular:standardize",
            input_uri=f"cos://{BUCKET}/{cos_prefix}raw",
            output_uri=f"cos://{BUCKET}/{cos_prefix}staged",
            partition=day,
            config={"feature_columns": FEATURE_COLUMNS, "label_column": "label", "schema": SCHEMA},
            num_executors=1,
            executor_cores=1,
            cos_conn_id=cos_conn,
            poll_interval=0.5,
            pending_timeout=120,
        )
        op.execution_timeout = None
        return op.execute({"ti": FakeTaskInstance(f"preprocess_{day}")})

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, days))
    assert [r["partition"] for r in results] == days
    assert all(sum(r["rows_out"].values()) == 400 for r in results)
    options = storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                     access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    for uri in [u for r in results for u in r["outputs"].values()]:  # each Spark task recorded its files
        committed, output = partitions.for_output_uri(uri, options)
        assert {f["checksum"] for f in committed.outputs[output]["files"]} == {"sha256"}
        assert partitions.dataset_files(committed, output, options, verify=True)  # what it wrote is there
