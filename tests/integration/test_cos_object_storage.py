"""``cos://`` in Airflow's object storage: ``ObjectStoragePath`` lists, reads and writes COS through
the ``cos`` connection, against the COS stand-in (moto's S3 server behind the COS adapter)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk import ObjectStoragePath

from devstack.constants import BUCKET

pytestmark = pytest.mark.integration


def test_dag_code_writes_reads_and_lists_cos_through_the_connection(cos_conn, cos_prefix):
    root = ObjectStoragePath(f"cos://{BUCKET}/{cos_prefix}raw", conn_id=cos_conn)
    (root / "dt=2026-11-30" / "_SUCCESS").write_text("")
    (root / "dt=2026-11-30" / "notes.txt").write_text("12 rows, all checked")
    with (root / "dt=2026-12-01" / "part-0.parquet").open("wb") as f:
        pq.write_table(pa.table({"x": [1.0, 2.0, 3.0]}), f)

    assert sorted(p.name for p in root.iterdir()) == ["dt=2026-11-30", "dt=2026-12-01"]
    assert (root / "dt=2026-11-30" / "notes.txt").read_text() == "12 rows, all checked"
    assert (root / "dt=2026-11-30" / "_SUCCESS").exists()
    assert not (root / "dt=2026-12-01" / "_SUCCESS").exists()
    with (root / "dt=2026-12-01" / "part-0.parquet").open("rb") as f:
        assert pq.read_table(f).column("x").to_pylist() == [1.0, 2.0, 3.0]
    assert [p.parent.name for p in root.glob("dt=*/_SUCCESS")] == ["dt=2026-11-30"]  # as in the docs
    found = [(p.bucket, p.key, p.conn_id) for p in root.glob("*/_SUCCESS")]
    assert found == [(BUCKET, f"{cos_prefix}raw/dt=2026-11-30/_SUCCESS", cos_conn)]


def test_a_missing_key_reads_as_missing(cos_conn, cos_prefix):
    path = ObjectStoragePath(f"cos://{BUCKET}/{cos_prefix}nothing/here.txt", conn_id=cos_conn)
    assert not path.exists()
    with pytest.raises(FileNotFoundError):
        path.read_text()
