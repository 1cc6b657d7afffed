"""Retention on the local filesystem: by reference and by time, writers judged by their activity.

Ages are the store's: here the files' modification times, set back with ``os.utime`` to stand for
days passing. The same rules on the COS stand-in, with a real Spark writer, are in
``tests/integration/test_partition_faults.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pyarrow as pa
import pytest

from emr_ray.cluster import partitions, retention, storage

DAY = 86400


def rows(n: int, start: int = 0) -> pa.Table:
    return pa.table({"x": list(range(start, start + n))})


@pytest.fixture
def partition(tmp_path) -> str:
    return f"file://{tmp_path}/staging/tabular/dt=2026-11-02"


def root_of(partition: str) -> str:
    return storage.split_uri(partition)[1]


def age(path: str, seconds: float) -> None:
    """Set ``path`` (and everything under it) ``seconds`` into the past."""
    then = time.time() - seconds
    for folder, _, files in os.walk(path):
        for name in files:
            os.utime(f"{folder}/{name}", (then, then))
    os.utime(path, (then, then))


def commits(partition: str, n: int) -> list[partitions.Committed]:
    """``n`` reruns of the date; all but the newest commit written ``days`` ago."""
    made = [partitions.write_tables(partition, {"train": rows(2, i)}, {}) for i in range(n)]
    for committed in made[:-1]:
        age(f"{root_of(partition)}/_commits/{committed.key}.json", 8 * DAY)
    return made


def generations(partition: str) -> list[str]:
    return sorted(os.listdir(f"{root_of(partition)}/_generations"))


def test_superseded_generations_stay_for_the_retention_period_whatever_their_count(partition):
    """Five reruns in a day remove nothing: a reader of any of them finishes. Once superseded for
    longer than the retention period, beyond ``keep``, they go (manifest first, then files)."""
    made = [partitions.write_tables(partition, {"train": rows(2, i)}, {}) for i in range(5)]
    retention.tidy(partition, policy=retention.Policy(keep=1))
    assert generations(partition) == sorted(c.generation for c in made)

    for committed in made[:-1]:  # eight days pass for all but the newest commit
        age(f"{root_of(partition)}/_commits/{committed.key}.json", 8 * DAY)
    plan = retention.plan(partition, policy=retention.Policy(keep=1))
    # made[3] was superseded by the newest commit, just now: it stays for its readers
    assert [r.name for r in plan] == [c.generation for c in made[:3]]
    assert "superseded 8.0 days ago (retention 7.0 days)" in plan[0].reason
    retention.remove(plan)
    assert generations(partition) == sorted(c.generation for c in made[3:])
    with pytest.raises(storage.StorageError, match="removed by retention"):
        partitions.pinned(partition, made[0].generation)
    assert partitions.current(partition).generation == made[-1].generation


def test_a_generation_a_pin_or_a_model_version_names_stays_whatever_its_age(partition):
    made = commits(partition, 5)
    retention.pin(partition, made[0].generation, "train-retrain_tabular-train-0123456789", kind="training")
    plan = retention.plan(partition, policy=retention.Policy(keep=1), referenced={made[1].generation})
    assert [r.name for r in plan] == [made[2].generation]

    # housekeeping releases the pin (its model version was deleted): then it goes too
    released = retention.plan(partition, policy=retention.Policy(keep=1), referenced={made[1].generation},
                              released=lambda pin: "its model version was deleted")  # fmt: skip
    assert [(r.kind, r.name) for r in released] == [
        ("pin", f"{made[0].generation}/train-retrain_tabular-train-0123456789"),
        ("generation", made[0].generation),
        ("generation", made[2].generation),
    ]
    retention.remove(released)
    assert retention.pins(partition) == []
    assert generations(partition) == sorted(c.generation for c in [made[1], *made[3:]])


def test_keep_counts_the_newest_commits_whatever_their_age(partition):
    made = commits(partition, 4)
    assert [r.name for r in retention.plan(partition, policy=retention.Policy(keep=3))] == [
        made[0].generation
    ]


def test_a_slow_writer_is_never_swept_while_its_lease_is_renewed(partition):
    """Judged by activity, not by when it started: a writer that began 9 h ago and still renews its
    lease keeps its files; one whose files and lease are 7 h old is abandoned."""
    root = root_of(partition)
    partitions.write_tables(partition, {"train": rows(2)}, {})
    started = dt.datetime.now(dt.UTC) - dt.timedelta(hours=9)
    slow, dead = partitions.new_generation(started), partitions.new_generation(started)
    for generation in (slow, dead):
        os.makedirs(f"{root}/_generations/{generation}/train")
        with open(f"{root}/_generations/{generation}/train/part-0.parquet", "wb") as f:
            f.write(b"written hours ago")
        age(f"{root}/_generations/{generation}", 7 * 3600)
    with partitions.writer_lease(partition, slow):  # the slow writer's lease, renewed now
        plan = retention.plan(partition)
    assert [(r.kind, r.name) for r in plan] == [("abandoned", dead)]
    assert "nothing in it changed for 7.0 h (abandoned after 6.0 h)" in plan[0].reason


def test_the_lease_is_renewed_from_its_own_thread(partition):
    generation = partitions.new_generation()
    lease = f"{root_of(partition)}/_generations/{generation}/{partitions.WRITER_LEASE}"

    def beat() -> int:
        try:
            with open(lease) as f:
                return json.load(f)["beat"]
        except ValueError:  # caught between the renewal's truncate and its write
            return 0

    with partitions.writer_lease(partition, generation, every_s=0.05):
        deadline, seen = time.monotonic() + 10, 0
        while seen < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = max(seen, beat())  # a second read could land between a truncate and its write
        assert seen >= 3


def test_files_that_are_not_ours_are_left_alone(partition):
    root = root_of(partition)
    partitions.write_tables(partition, {"train": rows(2)}, {})
    os.makedirs(f"{root}/_generations/notes-from-an-analyst")
    age(f"{root}/_generations/notes-from-an-analyst", 30 * DAY)
    assert retention.plan(partition) == []


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (lambda: retention.Policy(keep=0), "keep at least the current generation"),
        (lambda: retention.Policy(retain_s=-1), "cannot be negative"),
        (lambda: retention.Policy(abandon_after_s=60), "may only be waiting on a slow store"),
    ],
)
def test_a_policy_that_could_remove_live_data_is_refused(policy, message):
    with pytest.raises(storage.StorageError, match=message):
        policy()


def test_pin_holders_are_names_not_paths(partition):
    with pytest.raises(storage.StorageError, match="Pin holder '../x'"):
        retention.pin(partition, partitions.new_generation(), "../x")
