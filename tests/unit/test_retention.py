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
from emr_ray.cluster.model_retention import RunLineage, VersionFacts, VersionPolicy, versions_of_model

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
    assert retention.plan(partition, policy=retention.Policy(keep=1)) == []

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


# -- what the registry says ---------------------------------------------------------------------
NOW = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)


def training_pin(run_id: str | None, days_old: float = 8) -> retention.Pin:
    return retention.Pin("file:///d/dt=1", "g1", f"train-{run_id}",
                         {"kind": "training", "mlflow_run_id": run_id}, NOW - dt.timedelta(days=days_old))  # fmt: skip


def version(v: str, run_id: str, *, rank: int, days_old: float = 30, aliases=()) -> VersionFacts:
    return VersionFacts("m", v, run_id, NOW - dt.timedelta(days=days_old), tuple(aliases), rank)


def test_a_training_pin_goes_only_when_the_registry_positively_says_its_versions_are_not_kept():
    old = version("1", "r-old", rank=5)
    archived_champion = version("2", "r-champ", rank=4, aliases=["champion"])
    references = retention.References(
        runs={"r-old": RunLineage("r-old", (old,)), "r-champ": RunLineage("r-champ", (archived_champion,)),
              "r-none": RunLineage("r-none"), "r-hidden": RunLineage("r-hidden", problem="may not read 'x'")},
        asked=True,
    )  # fmt: skip
    why = references.release(retention.Policy(), NOW)
    assert why(training_pin("r-old")) == (
        "no version registered from its MLflow run r-old (m v1) is kept by the policy any more"
    )
    assert why(training_pin("r-none")) == "its MLflow run r-none registered no model version"
    assert why(training_pin(None)) == "its training never started an MLflow run"
    assert why(training_pin("r-champ")) is None  # an alias holder keeps its data
    assert why(training_pin("r-hidden")) is None  # the registry could not say
    assert why(training_pin("r-unasked")) is None  # never asked about: no evidence
    assert why(training_pin("r-old", days_old=2)) is None  # within the retention period


def test_an_incomplete_registry_answer_releases_nothing_and_removes_no_committed_data(partition):
    made = commits(partition, 4)
    retention.pin(partition, made[0].generation, "train-r1", kind="training", mlflow_run_id="r1")
    age(f"{root_of(partition)}/_pins", 8 * DAY)
    root = root_of(partition)
    dead = partitions.new_generation(dt.datetime.now(dt.UTC) - dt.timedelta(hours=9))
    os.makedirs(f"{root}/_generations/{dead}/train")
    age(f"{root}/_generations/{dead}", 7 * 3600)
    incomplete = retention.References(runs={"r1": RunLineage("r1")}, problems=("MLflow is down",), asked=True)
    policy = retention.Policy(keep=1, expire_after_s=8 * DAY)
    swept = retention.sweep(partition.rpartition("/")[0], None, policy, incomplete)
    assert [(r.kind, r.name) for r in swept.planned] == [("abandoned", dead)]  # needs no registry
    complete = retention.References(runs={"r1": RunLineage("r1")}, asked=True)
    swept = retention.sweep(partition.rpartition("/")[0], None, policy, complete)
    assert {r.kind for r in swept.planned} == {"pin", "generation", "abandoned"}


def test_a_pin_is_never_downgraded_by_a_rerun_without_its_run_id(partition):
    generation = commits(partition, 1)[0].generation
    retention.pin(partition, generation, "train-x", kind="training", mlflow_run_id="r1")
    retention.pin(partition, generation, "train-x", kind="training", mlflow_run_id=None)  # a reused training
    (found,) = retention.pins(partition)
    assert found.mlflow_run_id == "r1"
    retention.pin(partition, generation, "train-x", kind="training", mlflow_run_id="r2")  # a fresh fit
    assert retention.pins(partition)[0].mlflow_run_id == "r2"


def test_a_writers_own_clean_up_never_removes_committed_data(partition):
    """However old the superseded generations, only the sweep (which asks the registry) removes them."""
    made = commits(partition, 5)
    retention.tidy(partition, policy=retention.Policy(keep=1))
    assert generations(partition) == sorted(c.generation for c in made)


def test_a_partition_expires_whole_only_when_nothing_holds_any_of_its_generations(partition):
    made = commits(partition, 2)
    age(f"{root_of(partition)}/_commits", 31 * DAY)
    policy = retention.Policy(keep=3, expire_after_s=30 * DAY)
    plan = retention.plan(partition, policy=policy)
    assert [r.name for r in plan] == [c.generation for c in made]  # the current one goes last
    assert "rerun its preprocessing to produce it again" in plan[-1].reason
    retention.pin(partition, made[0].generation, "audit-q4", kind="manual")
    assert retention.plan(partition, policy=policy) == []  # an older one would become current
    with pytest.raises(storage.StorageError, match="cannot expire before"):
        retention.Policy(retain_s=7 * DAY, expire_after_s=DAY)


def test_sixty_days_of_daily_runs_keep_storage_flat_and_every_alias_holders_data_whole(tmp_path):
    """Daily partitions, a training and a registration each day, a new champion every 10 days, the
    sweep daily (the store's clock moved a day at a time): bytes stop growing once the retention period
    has passed, and the champion's and the newest versions' generations always read whole."""
    dataset = f"file://{tmp_path}/staging/tabular"
    policy = retention.Policy(retain_s=7 * DAY, expire_after_s=7 * DAY,
                              versions=VersionPolicy(keep_newest=3, keep_days=7))  # fmt: skip
    start = dt.datetime(2026, 9, 1, tzinfo=dt.UTC)
    trained: dict[str, partitions.Committed] = {}
    rows_, aliases, sizes = [], {}, []
    for day in range(60):
        now = start + dt.timedelta(days=day)
        partition = f"{dataset}/dt={now:%Y-%m-%d}"
        committed = partitions.write_tables(partition, {"train": rows(500, day)}, {})
        run_id = f"run-{day:02d}"
        retention.pin(
            partition, committed.generation, f"train-{run_id}", kind="training", mlflow_run_id=run_id
        )
        age(root_of(partition), time.time() - now.timestamp())  # written "on that day"
        trained[run_id] = committed
        rows_.append((str(day + 1), run_id, int(now.timestamp() * 1000), {}))
        aliases["challenger"] = str(day + 1)
        if day % 10 == 0:
            aliases["champion"] = str(day + 1)
        facts = versions_of_model("m", rows_, aliases)
        references = retention.References({v.run_id: RunLineage(v.run_id, (v,)) for v in facts}, asked=True)
        swept = retention.sweep(
            dataset, None, policy, references, dry_run=False, now=now + dt.timedelta(hours=1)
        )
        assert not swept.failed
        sizes.append(sum(f.stat().st_size for f in (tmp_path / "staging").rglob("*") if f.is_file()))
        for v in facts:
            if policy.versions.why_kept(v, now):  # every kept version's data reads whole
                assert partitions.pinned(trained[v.run_id].partition_uri, trained[v.run_id].generation)
        assert len(read_all(trained[f"run-{int(aliases['champion']) - 1:02d}"], "train")) == 500
    one_day = sizes[0]
    assert max(sizes[20:]) <= max(sizes[10:20]), sizes  # flat after the retention period
    assert max(sizes) <= 12 * one_day, sizes  # a week of dates, the champion's, the newest versions'
    print("bytes kept by day (10..60):", sizes[9::10], "one day's generation:", one_day)


def read_all(committed: partitions.Committed, output: str) -> list[int]:
    import pyarrow.parquet as pq

    fsys = storage.filesystem(committed.partition_uri)
    files = partitions.dataset_files(committed, output)
    return [v for path, _ in files for v in pq.read_table(path, filesystem=fsys).column("x").to_pylist()]
