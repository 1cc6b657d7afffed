"""Per-worker shards of a committed Parquet partition: the training feed (runs on the cluster).

Each Ray Train worker reads its own contiguous range of rows straight from the Parquet files with
pyarrow (only the row groups it needs), instead of streaming every row through Ray Data. Measured
in ``bench/data_path.py``: 5.2M rows/s into tensors this way, against 62k rows/s through
``read_parquet`` -> ``iter_torch_batches`` on the same machine.

The job plans the shards once (file list and row counts from the Parquet footers, no data read)
and hands the plan to the workers in their config; a worker reads its range on start through the
public :func:`emr_ray.cluster.train.worker_shard`. Training
shards are equal in size (at most ``world_size - 1`` rows are dropped), so every DDP worker runs
the same number of steps; evaluation shards split all rows. A worker holds its shard in memory:
``rows / workers x columns x 4`` bytes; add workers (or nodes) for partitions larger than that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the key of the shard plan in the train loop's config (the job adds it; the loop reads it)
PLAN_KEY = "_emr_ray_shards"


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of one Parquet file."""

    path: str
    start: int
    stop: int


def plan(files: list[tuple[str, int]], world_size: int, *, equal: bool) -> list[list[Piece]]:
    """Split the rows of ``files`` (``(path, rows)`` in order) into ``world_size`` contiguous ranges.

    ``equal=True`` gives every rank ``total // world_size`` rows (for training); otherwise all rows
    are spread, the first ranks taking one extra where the total does not divide (for evaluation).
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: need at least one worker.")
    total = sum(rows for _, rows in files)
    if equal:
        per = total // world_size
        bounds = [(r * per, (r + 1) * per) for r in range(world_size)]
    else:
        bounds = [(r * total // world_size, (r + 1) * total // world_size) for r in range(world_size)]
    shards: list[list[Piece]] = []
    for lo, hi in bounds:
        pieces, offset = [], 0
        for path, rows in files:
            start, stop = max(lo - offset, 0), min(hi - offset, rows)
            if start < stop:
                pieces.append(Piece(path, start, stop))
            offset += rows
        shards.append(pieces)
    return shards


def read(pieces: list[Piece], fsys: Any, columns: list[str]):
    """The rows of ``pieces`` as one pyarrow Table, reading only the row groups they overlap.

    ``pre_buffer``: the column chunks a read needs are fetched as a few coalesced ranges, in
    parallel on pyarrow's I/O threads, before decoding (as ``pq.read_table`` does), rather than
    one blocking read per column chunk. Ray gives a 1-CPU worker one decoding thread
    (``OMP_NUM_THREADS=1`` sizes pyarrow's CPU pool); the I/O pool is apart. One request per range
    rather than per column also matters more on COS and WebHDFS than on a local disk.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for piece in pieces:
        with fsys.open_input_file(piece.path) as f:
            parquet = pq.ParquetFile(f, pre_buffer=True)
            groups: list[int] = []
            first_row = row = 0
            for i in range(parquet.metadata.num_row_groups):
                n = parquet.metadata.row_group(i).num_rows
                if row < piece.stop and row + n > piece.start:
                    first_row = first_row if groups else row
                    groups.append(i)
                row += n
            if not groups:
                continue
            table = parquet.read_row_groups(groups, columns=columns)
            tables.append(table.slice(piece.start - first_row, piece.stop - piece.start))
    if not tables:
        return None
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def read_dataset_entry(entry: dict[str, Any], fsys: Any):
    """Every row and column of one planned dataset (an entry of the plan's ``datasets``), as one Table.

    For what the job's driver reads whole: the test rows it scores models on, a vocabulary or an id
    index that is logged with the model.
    """
    import pyarrow.parquet as pq

    if not entry["files"]:
        return None
    columns = list(entry.get("columns") or {})  # the plan read the footer already
    if not columns:
        with fsys.open_input_file(entry["files"][0][0]) as f:
            columns = pq.ParquetFile(f).schema_arrow.names
    return read([Piece(path, 0, int(rows)) for path, rows in entry["files"]], fsys, columns)


def dataset_reader(plan: dict[str, Any], options: Any):
    """``read_dataset(name)`` over a job's plan, for a training module's ``serving_model``: the whole
    dataset ``name`` (a vocabulary, an id index) of exactly the generation this training read."""
    from emr_ray.cluster import storage

    def read_dataset(name: str):
        entry = plan["datasets"].get(name)
        if entry is None:
            raise ValueError(
                f"No dataset {name!r} in this training (it has {sorted(plan['datasets'])}); "
                "pass it in the training operator's datasets."
            )
        return read_dataset_entry(entry, storage.filesystem(entry["uri"], options))

    return read_dataset


def describe(
    uri: str, files: list[tuple[str, int]], *, equal: bool, columns: dict[str, str] | None = None
) -> dict[str, Any]:
    """One dataset's entry in the plan the job passes to the workers (``columns``: name to Arrow type,
    from the first file's footer, for the run's MLflow dataset)."""
    return {
        "uri": uri,
        "files": [[path, rows] for path, rows in files],
        "equal": equal,
        "columns": columns or {},
    }
