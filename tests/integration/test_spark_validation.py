"""Bad raw partitions fail the Spark step with a message naming the partition, the column and the
problem, and leave no output behind. Real Ray jobs; the Airflow task context is the stand-in from
``test_ray_jobs``. The value checks Spark makes (NaN and infinity) are in ``test_spark_session``'s
bad-input test, inside a warm session.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from emr_ray.cluster import storage
from emr_ray.exceptions import RayJobFailedError
from emr_ray.operators.raydp import RayDPSparkOperator
from include.data.synthetic import FEATURE_COLUMNS, make_partition
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration
SCHEMA = {**dict.fromkeys(FEATURE_COLUMNS, "double"), "label": "int64"}


def write_raw(root, partition: str, table: pa.Table) -> None:
    path = root / "raw" / f"dt={partition}"
    path.mkdir(parents=True)
    pq.write_table(table, path / "part-00000.parquet")
    storage.write_marker(f"file://{path}")


def preprocess(root, partition: str) -> RayDPSparkOperator:
    return RayDPSparkOperator(
        task_id="preprocess",
        preprocess="include.preprocessing.tabular:standardize",
        input_uri=f"file://{root}/raw",
        output_uri=f"file://{root}/staged",
        partition=partition,
        config={
            "feature_columns": FEATURE_COLUMNS,
            "label_column": "label",
            "schema": SCHEMA,
            "finite_columns": FEATURE_COLUMNS,
        },  # fmt: skip
        poll_interval=0.5,
    )


def test_wrong_schema_is_refused_before_spark_starts(ray_conn, tmp_path):
    table = make_partition("2026-11-06", 100).drop_columns(["f00"])
    table = table.set_column(table.schema.get_field_index("f01"), "f01", pa.array(["x"] * 100))
    write_raw(tmp_path, "2026-11-06", table)
    with pytest.raises(RayJobFailedError) as failure:
        preprocess(tmp_path, "2026-11-06").execute({"ti": FakeTaskInstance("preprocess")})
    message = str(failure.value)
    assert "raw/dt=2026-11-06 failed validation" in message
    assert "column 'f00' is missing (expected double)" in message
    assert "column 'f01' has type string, expected double" in message
    assert not (tmp_path / "staged").exists()
