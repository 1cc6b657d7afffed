"""Per-worker shards: every row read exactly once, equal training shards, only needed row groups."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from emr_ray.cluster.jobs.shards import Piece, plan, read


def _rows(shard: list[Piece]) -> int:
    return sum(p.stop - p.start for p in shard)


def test_evaluation_shards_cover_every_row_once_in_order() -> None:
    files = [("a", 5), ("b", 0), ("c", 7)]
    shards = plan(files, 3, equal=False)
    assert [_rows(s) for s in shards] == [4, 4, 4]
    flat = [(p.path, r) for s in shards for p in s for r in range(p.start, p.stop)]
    assert flat == [("a", r) for r in range(5)] + [("c", r) for r in range(7)]


def test_training_shards_are_equal_so_every_ddp_worker_runs_the_same_steps() -> None:
    shards = plan([("a", 10), ("b", 3)], 2, equal=True)
    assert [_rows(s) for s in shards] == [6, 6]  # one row of 13 dropped, never more than world - 1
    assert shards[0] == [Piece("a", 0, 6)]
    assert shards[1] == [Piece("a", 6, 10), Piece("b", 0, 2)]


def test_a_single_worker_gets_everything() -> None:
    assert plan([("a", 3), ("b", 4)], 1, equal=True) == [[Piece("a", 0, 3), Piece("b", 0, 4)]]


def test_zero_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        plan([("a", 3)], 0, equal=True)


def test_read_returns_exactly_the_planned_rows_across_row_groups(tmp_path) -> None:
    paths = []
    for i in range(2):
        path = str(tmp_path / f"part-{i}.parquet")
        values = list(range(i * 100, i * 100 + 100))
        pq.write_table(pa.table({"x": values, "y": values}), path, row_group_size=30)
        paths.append(path)
    local = pafs.LocalFileSystem()
    seen = []
    for shard in plan([(p, 100) for p in paths], 3, equal=False):
        table = read(shard, local, ["x"])
        assert table.column_names == ["x"]
        seen += table.column("x").to_pylist()
    assert seen == list(range(200))
