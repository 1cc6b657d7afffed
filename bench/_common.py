"""Shared helpers for the benchmarks: isolated Ray state, the synthetic data set, timing and output.

Everything lives under ``.state/bench`` (``rm -rf`` it to reset). Run the benchmarks inside the
loopback-only namespace, as modules from the repository root:
``bash scripts/loopback.sh .venv/bin/python -m bench.data_path``.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from emr_ray.sizing.shapes import table as markdown_table
from include.data.synthetic import FEATURE_COLUMNS, LABEL_COLUMN, make_partition

REPO = Path(__file__).resolve().parents[1]
STATE = REPO / ".state" / "bench"
RESULTS = REPO / "bench" / "results"
FILES_PER_DATASET = 8
_ENV_BEFORE_RAY = False  # setup_env() ran before ray was imported


def setup_env() -> Path:
    """Environment for an in-process Ray on 127.0.0.1 with its own temp dir, token and ``HOME``.

    Must run before ``import ray``; Ray's worker processes inherit it (so they import ``include``).
    """
    from devstack.ray_head import cluster_env

    ray_state = STATE / "ray"
    (ray_state / "home").mkdir(parents=True, exist_ok=True)
    token = ray_state / "auth_token"
    if not token.exists():
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
    os.environ.update(cluster_env(ray_state))
    # this tree's plugins/ (emr_ray) and include/, ahead of any installed emr_ray (an editable install
    # of another checkout): Ray's worker processes inherit it, so actors import the code measured here
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "plugins"), str(REPO)])
    global _ENV_BEFORE_RAY
    _ENV_BEFORE_RAY = _ENV_BEFORE_RAY or "ray" not in sys.modules
    return ray_state


def init_ray(num_cpus: int = 2) -> float:
    """Start an in-process Ray node on 127.0.0.1; returns the seconds ``ray.init`` took.

    Call :func:`setup_env` first, before anything imports ``ray``.
    """
    import logging

    import ray

    from devstack.ray_head import ray_temp_dir

    if not _ENV_BEFORE_RAY:
        raise RuntimeError("call setup_env() before anything imports ray (Ray reads RAY_AUTH_MODE at import)")
    ray_state = setup_env()
    started = time.perf_counter()
    ray.init(
        num_cpus=num_cpus,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        _temp_dir=str(ray_temp_dir(ray_state)),
        object_store_memory=2_000_000_000,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    seconds = time.perf_counter() - started
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    return seconds


def write_dataset(rows: int, name: str, *, files: int = FILES_PER_DATASET, seed: str = "bench") -> list[str]:
    """``rows`` rows x 16 float32 features (standardized, as the staged partition is) + int64 label.

    Written once as ``files`` Parquet files under ``.state/bench/data/<name>``; reused when present.
    Deterministic: the same rows for the same arguments. Returns the files' absolute paths.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = STATE / "data" / name
    marker = folder / "_DONE.json"
    paths = [str(folder / f"part-{i:05d}.parquet") for i in range(files)]
    meta = {"rows": rows, "files": files, "seed": seed, "columns": FEATURE_COLUMNS + [LABEL_COLUMN]}
    if marker.exists() and json.loads(marker.read_text()) == meta:
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    mean = std = None
    for i, path in enumerate(paths):
        n = rows // files + (1 if i < rows % files else 0)
        table = make_partition(f"{seed}-{i}", n)
        x = np.column_stack([table[c].to_numpy() for c in FEATURE_COLUMNS])
        if mean is None:  # standardize with the first file's statistics ("fitted on a sample")
            mean, std = x.mean(axis=0), x.std(axis=0)
        x = ((x - mean) / std).astype(np.float32)
        out = {c: x[:, j] for j, c in enumerate(FEATURE_COLUMNS)}
        out[LABEL_COLUMN] = table[LABEL_COLUMN]
        pq.write_table(pa.table(out), path)
    marker.write_text(json.dumps(meta))
    return paths


def evict(paths: list[str]) -> None:
    """Drop the files' pages from the OS page cache (``POSIX_FADV_DONTNEED``) so the next read is cold."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def table_to_tensors(table) -> tuple[Any, Any]:
    """A pyarrow Table -> (features float32 [n, 16], labels int64 [n]) as torch tensors."""
    import numpy as np
    import torch

    x = np.empty((table.num_rows, len(FEATURE_COLUMNS)), dtype=np.float32)
    for j, c in enumerate(FEATURE_COLUMNS):
        x[:, j] = table.column(c).to_numpy()
    y = table.column(LABEL_COLUMN).to_numpy()
    return torch.from_numpy(x), torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))


def read_shard(paths: list[str]):
    """``pyarrow.parquet.read_table`` of some files -> tensors (the upper-bound reader)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = FEATURE_COLUMNS + [LABEL_COLUMN]
    tables = [pq.read_table(p, columns=columns) for p in paths]
    return table_to_tensors(pa.concat_tables(tables) if len(tables) > 1 else tables[0])


@contextmanager
def timed(into: dict[str, Any], key: str) -> Iterator[None]:
    """Record the block's wall-clock seconds and the 1-minute load average at its end."""
    started = time.perf_counter()
    yield
    into[key] = round(time.perf_counter() - started, 3)
    into[f"{key}_load1"] = round(os.getloadavg()[0], 2)


def machine() -> dict[str, Any]:
    import pyarrow
    import ray
    import torch

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
        "pyarrow": pyarrow.__version__,
        "loadavg_at_start": [round(v, 2) for v in os.getloadavg()],
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def machine_busy_cpu_s() -> float:
    """CPU-seconds the whole machine has been busy since boot (user, nice, system, irq, softirq, steal;
    ``/proc/stat``): every process, also those no one waits for, such as children the kernel reaps."""
    with open("/proc/stat") as f:
        cpu = [int(v) for v in f.readline().split()[1:]]
    return (sum(cpu[:3]) + sum(cpu[5:8])) / os.sysconf("SC_CLK_TCK")


def write_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    return path


#: the one markdown table of the project (the sizing table's), bench's too
table = markdown_table


def rate(rows: int, seconds: float | None) -> str:
    """``rows / seconds`` for a table, e.g. ``1.23M`` or ``456k``."""
    return per_second(rows / seconds if seconds else None)


def per_second(value: float | None) -> str:
    if not value:
        return "-"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k"


def footer_rows(paths: list[str]) -> list[tuple[str, int]]:
    """``(path, rows)`` of each local file from its Parquet footer (no data read), as ``emr_ray.cluster.jobs.train`` plans."""
    from emr_ray.cluster import storage

    return storage.parquet_row_counts(paths, "file:///")


def shard_plan(datasets: dict[str, list[tuple[str, int]]]) -> dict[str, Any]:
    """The shard plan of local files the job passes to its workers (training datasets get equal shards)."""
    from emr_ray.cluster.jobs import shards

    described = {
        name: shards.describe(
            f"file://{files[0][0].rpartition('/')[0] if files else ''}", files, equal=name == "train"
        )
        for name, files in datasets.items()
    }
    return {"datasets": described, "storage": {}}


def shard_config(files: list[tuple[str, int]], *, equal: bool = True, name: str = "train") -> dict[str, Any]:
    """A train-loop config holding a shard plan of local ``files``, as the job passes it to the workers."""
    from emr_ray.cluster.jobs import shards

    plan = shard_plan({name: files})
    plan["datasets"][name]["equal"] = equal
    return {"feature_columns": FEATURE_COLUMNS, "label_column": LABEL_COLUMN, shards.PLAN_KEY: plan}


def worker_tensors(config: dict[str, Any], name: str, rank: int, world: int) -> tuple[Any, Any]:
    """``include.training.loop._tensors`` for rank ``rank`` of ``world``, outside Ray Train.

    ``_tensors`` is called as is. Only its ``emr_ray.cluster.train.worker_shard`` call, which asks Ray
    Train's context for the rank and world size, is swapped (for this call, in this process) for a
    stand-in that takes them as arguments and does the rest as ``worker_shard`` does:
    ``shards.plan(footer row counts, world, equal=...)`` then ``shards.read(pieces, pyarrow
    LocalFileSystem, columns)``. So the benchmark times the product's own planning, reading and
    conversion code rather than a copy of it.
    """
    from unittest import mock

    from pyarrow import fs

    from emr_ray.cluster import train as emr_train
    from emr_ray.cluster.jobs import shards
    from include.training.loop import _tensors

    def local_worker_shard(config: dict[str, Any], name: str, columns: list[str]):
        entry = config[shards.PLAN_KEY]["datasets"][name]
        pieces = shards.plan([(p, int(n)) for p, n in entry["files"]], world, equal=entry["equal"])
        return shards.read(pieces[rank], fs.LocalFileSystem(), columns)

    with mock.patch.object(emr_train, "worker_shard", local_worker_shard):
        inputs, labels, _ = _tensors(config, name)
    return inputs[0], labels  # the tabular config declares one input: the feature matrix
