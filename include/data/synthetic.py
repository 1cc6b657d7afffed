"""Synthetic raw data for the tabular retraining DAG: daily partitions of 16 float features and a label.

Deterministic per date (seeded by it), so a rerun writes the same bytes. The label comes from a
fixed hidden linear rule plus noise, so a small MLP learns it well above chance. Runs without
Airflow: ``python -m include.data.synthetic --root cos://bucket/raw --start 2026-11-26 --days 3``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib

N_FEATURES = 16
FEATURE_COLUMNS = [f"f{i:02d}" for i in range(N_FEATURES)]
LABEL_COLUMN = "label"


def make_partition(partition: str, rows: int):
    """One day's raw rows as a pyarrow Table (features on different scales, as raw data is)."""
    import numpy as np
    import pyarrow as pa

    seed = int(hashlib.sha256(partition.encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    weights = np.random.default_rng(7).normal(size=N_FEATURES)
    scales = np.linspace(0.5, 50.0, N_FEATURES)
    offsets = np.linspace(-20.0, 100.0, N_FEATURES)
    z = rng.normal(size=(rows, N_FEATURES))
    logits = z @ weights + 0.5 * np.sin(3 * z[:, 0]) + rng.normal(scale=0.3, size=rows)
    label = (logits > 0).astype("int64")
    x = z * scales + offsets
    columns = {name: pa.array(x[:, i].astype("float64")) for i, name in enumerate(FEATURE_COLUMNS)}
    columns[LABEL_COLUMN] = pa.array(label)
    return pa.table(columns)


def write_partitions(root: str, start: str, days: int, rows: int, options=None) -> list[str]:
    """Write ``days`` partitions from ``start`` under ``root`` (each committed with ``_SUCCESS``)."""
    import pyarrow.parquet as pq

    from emr_ray.cluster import storage

    written = []
    first = dt.date.fromisoformat(start)
    fsys, base = storage.resolve(root, options)
    for offset in range(days):
        partition = (first + dt.timedelta(days=offset)).isoformat()
        path = f"{base}/dt={partition}"
        fsys.create_dir(path, recursive=True)
        pq.write_table(make_partition(partition, rows), f"{path}/part-00000.parquet", filesystem=fsys)
        uri = storage.join(root, f"dt={partition}")
        storage.write_marker(uri, options)
        written.append(uri)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True, help="file:///abs/raw or cos://bucket/raw")
    parser.add_argument("--start", required=True, help="first partition, YYYY-MM-DD")
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--rows", type=int, default=20000)
    args = parser.parse_args(argv)
    for uri in write_partitions(args.root, args.start, args.days, args.rows):
        print(uri)


if __name__ == "__main__":
    main()
