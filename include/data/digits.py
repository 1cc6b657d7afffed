"""Raw partitions of scikit-learn's bundled handwritten digits (no download: the data ships with it).

Each partition holds the 1,797 images as 64 pixel columns (0..16) and a label; written with
``_SUCCESS`` like any producer's partition.
"""

from __future__ import annotations

import datetime as dt

PIXELS = [f"p{i:02d}" for i in range(64)]


def write_partitions(root: str, start: str, days: int, options=None) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits

    from emr_ray.cluster import storage

    digits = load_digits()
    table = pa.table(
        {
            **{p: digits.data[:, i].astype("float64") for i, p in enumerate(PIXELS)},
            "label": digits.target.astype("int64"),
        }
    )
    written = []
    fsys, base = storage.resolve(root, options)
    for offset in range(days):
        partition = (dt.date.fromisoformat(start) + dt.timedelta(days=offset)).isoformat()
        fsys.create_dir(f"{base}/dt={partition}", recursive=True)
        pq.write_table(table, f"{base}/dt={partition}/part-00000.parquet", filesystem=fsys)
        uri = storage.join(root, f"dt={partition}")
        storage.write_marker(uri, options)
        written.append(uri)
    return written
