"""The synthetic interaction logs behind the recommender DAG: deterministic daily partitions with
personal taste a model can learn and a popularity skew that makes a real, but beatable, baseline."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from include.data import interactions
from include.data.interactions import WorldOptions

DAY = "2026-11-02"


@pytest.fixture(scope="module")
def log():
    return interactions.make_partition(DAY).to_pandas()


def test_a_partition_is_the_same_bytes_every_time_and_another_day_differs():
    assert interactions.make_partition(DAY).equals(interactions.make_partition(DAY))
    assert not interactions.make_partition(DAY).equals(interactions.make_partition("2026-11-03"))


def test_rows_are_string_ids_timed_within_the_day(log):
    table = interactions.make_partition(DAY)
    assert {f.name: str(f.type) for f in table.schema} == interactions.SCHEMA
    assert log["user_id"].str.fullmatch(r"u\d{4}").all() and log["item_id"].str.fullmatch(r"i\d{4}").all()
    assert log["ts"].min().date().isoformat() == DAY == log["ts"].max().date().isoformat()
    assert log["ts"].is_monotonic_increasing
    assert set(log["event"]) == set(interactions.EVENTS)


def test_every_user_touches_20_to_40_distinct_items(log):
    options = WorldOptions()
    per_user = log.groupby("user_id")["item_id"]
    assert per_user.size().between(options.min_per_user, options.max_per_user).all()
    assert (per_user.nunique() == per_user.size()).all()  # no repeated (user, item) pair
    assert log["user_id"].nunique() == options.users
    assert log["item_id"].nunique() == options.items


def _recall_at_10(log, score_of):
    """Hold out each user's last item; the share ranked in the top 10 of the items the user has not touched."""
    last = log.groupby("user_id").tail(1)
    seen = log.drop(last.index).groupby("user_id")["item_id"].agg(set)
    items = sorted(log["item_id"].unique())
    hits = 0
    for user, held_out in zip(last["user_id"], last["item_id"], strict=True):
        candidates = [i for i in items if i not in seen[user]]
        top = sorted(candidates, key=lambda i: (-score_of(user, i), i))[:10]
        hits += held_out in top
    return hits / len(last)


def test_taste_is_personal_and_popularity_a_real_but_weaker_baseline(log):
    preference = interactions.preferences()
    last = log.groupby("user_id").tail(1)
    popularity = log.drop(last.index)["item_id"].value_counts()

    def taste(user, item):
        return preference[int(user[1:]) - 1, int(item[1:]) - 1]

    by_popularity = _recall_at_10(log, lambda user, item: popularity.get(item, 0))
    by_taste = _recall_at_10(log, taste)
    assert by_popularity > 3 * 10 / WorldOptions().items  # far above a random top 10
    assert by_taste > by_popularity + 0.3  # and the hidden taste far above popularity


def test_write_partitions_commits_one_parquet_file_per_day(tmp_path):
    small = WorldOptions(users=20, items=30, min_per_user=3, max_per_user=5)
    uris = interactions.write_partitions(f"file://{tmp_path}", DAY, 2, world_options=small)
    assert uris == [f"file://{tmp_path}/dt=2026-11-02", f"file://{tmp_path}/dt=2026-11-03"]
    for day in ("2026-11-02", "2026-11-03"):
        assert (tmp_path / f"dt={day}" / "_SUCCESS").exists()
        table = pq.read_table(tmp_path / f"dt={day}" / "part-00000.parquet")
        assert table.equals(interactions.make_partition(day, small))
        assert 20 * 3 <= table.num_rows <= 20 * 5


def test_the_command_line_takes_the_world_size(tmp_path, capsys):
    interactions.main(["--root", f"file://{tmp_path}", "--start", DAY, "--users", "5", "--items", "9",
                       "--min-per-user", "2", "--max-per-user", "3"])  # fmt: skip
    assert capsys.readouterr().out.split() == [f"file://{tmp_path}/dt={DAY}"]
    assert np.unique(pq.read_table(tmp_path / f"dt={DAY}").column("user_id").to_numpy()).size == 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"items": 1}, "items >= 2"),
        ({"max_per_user": 301}, "Lower max_per_user or add items"),
        ({"min_per_user": 5, "max_per_user": 4}, "min_per_user <= max_per_user"),
    ],
)
def test_an_impossible_world_is_refused_with_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        WorldOptions(**options)
