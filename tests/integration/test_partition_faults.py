"""Partitions under faults, on all three storages: a writer killed at each step of its commit, two
writers of one date at once with a reader watching, and COS throttling, refusing and answering late
during the commit.

Each test asserts on the data itself: which generation is current, the bytes of its files, the rows
a reader gets. The storages are the real clients against the local servers: ``file://``, the COS
stand-in (moto's S3 backend behind the COS adapter) and the WebHDFS stand-in (no NameNode can run
here). A killed writer is a real process that dies with ``os._exit`` at the chosen step.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devstack.constants import BUCKET, REGION, SECRET_ID, SECRET_KEY
from emr_ray.cluster import partitions, retention, storage

pytestmark = pytest.mark.integration

SCHEMES = ("file", "cos", "hdfs")


@pytest.fixture(params=SCHEMES)
def target(request, tmp_path) -> tuple[str, storage.StorageOptions | None]:
    """A fresh partition URI on one storage, with the options that reach it."""
    date = "dt=2026-11-20"
    if request.param == "file":
        return f"file://{tmp_path}/staged/{date}", None
    if request.param == "cos":
        server = request.getfixturevalue("cos_server")
        options = storage.StorageOptions(endpoint_override=server.endpoint, scheme="http", region=REGION,
                                         access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
        return f"cos://{BUCKET}/faults-{uuid.uuid4().hex[:8]}/staged/{date}", options
    options = request.getfixturevalue("hdfs_options")
    return f"{request.getfixturevalue('hdfs_root')}/staged/{date}", options


def tables(value: int, rows: int) -> dict[str, pa.Table]:
    """One writer's outputs: every row holds the writer's own value, so a mix is visible."""
    return {"train": pa.table({"x": [value] * rows}), "test": pa.table({"x": [value] * (rows // 4)})}


def read_back(committed: partitions.Committed, options) -> dict[str, list[int]]:
    """Every value of every output, read exactly as the training job reads: the files the manifest lists."""
    fsys = storage.filesystem(committed.partition_uri, options)
    return {
        name: [
            v
            for path, _ in partitions.dataset_files(committed, name, options)
            for v in pq.read_table(path, filesystem=fsys).column("x").to_pylist()
        ]  # fmt: skip
        for name in committed.outputs
    }


def file_bytes(committed: partitions.Committed, options) -> dict[str, str]:
    fsys = storage.filesystem(committed.partition_uri, options)
    digests = {}
    for name in committed.outputs:
        for path, _ in partitions.dataset_files(committed, name, options, verify=True):  # checksums too
            with fsys.open_input_stream(path) as f:
                digests[path] = hashlib.sha256(f.read()).hexdigest()
    return digests


def assert_whole(committed: partitions.Committed, options) -> int:
    """One writer's complete outputs, nothing else: returns that writer's value."""
    values = read_back(committed, options)
    seen = {v for column in values.values() for v in column}
    assert len(seen) == 1, f"generation {committed.generation} mixes writers: {seen}"
    for name, column in values.items():
        assert len(column) == committed.outputs[name]["rows"]
    return seen.pop()


# A writer that dies (os._exit) at one step of partitions.write_tables.
CRASHING_WRITER = """
import json, os, sys
import pyarrow as pa
import pyarrow.parquet as pq
from emr_ray.cluster import partitions, retention, storage

uri, step, raw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
options = storage.StorageOptions(**raw) if raw else None

def die(*args, **kwargs):
    os._exit(9)

if step == "mid_data":  # the first output written, the second not
    written = []
    real_write = pq.write_table
    def write_table(*args, **kwargs):
        written.append(1)
        if len(written) == 2:
            die()
        real_write(*args, **kwargs)
    pq.write_table = write_table
elif step == "before_manifest":
    partitions._write_atomically = die
elif step == "during_manifest":  # the manifest's temporary written, the rename (or PUT) not done
    def half(partition_uri, name, text, opts):
        fsys, root = storage.resolve(partition_uri, opts)
        folder, _, base = f"{root}/{name}".rpartition("/")
        fsys.create_dir(folder, recursive=True)
        with fsys.open_output_stream(f"{folder}/.{base}.tmp") as f:
            f.write(text.encode()[: len(text) // 2])
        die()
    partitions._write_atomically = half
elif step == "after_manifest":  # committed, then died in the housekeeping after it
    retention.plan = die
partitions.write_tables(uri, {"train": pa.table({"x": [9] * 40}), "test": pa.table({"x": [9] * 10})}, {}, options)
retention.tidy(uri, options)
"""


@pytest.mark.parametrize("step", ["mid_data", "before_manifest", "during_manifest", "after_manifest"])
def test_a_writer_killed_at_any_step_leaves_a_whole_current_generation(target, step):
    uri, options = target
    good = partitions.write_tables(uri, tables(1, 40), {}, options)
    before = file_bytes(good, options)
    raw = json.dumps(dataclasses.asdict(options) if options else None)
    died = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, uri, step, raw], capture_output=True, text=True
    )
    assert died.returncode == 9, died.stderr[-3000:]

    current = partitions.current(uri, options)
    if step == "after_manifest":  # the new generation had been committed whole
        assert current.generation != good.generation and assert_whole(current, options) == 9
    else:  # the previous generation stays current, byte for byte
        assert current.generation == good.generation
        assert file_bytes(current, options) == before and assert_whole(current, options) == 1
    retry = partitions.write_tables(uri, tables(2, 40), {}, options)
    assert partitions.current(uri, options).generation == retry.generation
    assert assert_whole(partitions.current(uri, options), options) == 2
    assert file_bytes(partitions.pinned(uri, good.generation, options), options) == before


def write_and_tidy(uri: str, outputs: dict[str, pa.Table], options) -> partitions.Committed:
    """A writer as the Spark job is one: commit, then its housekeeping."""
    committed = partitions.write_tables(uri, outputs, {}, options)
    retention.tidy(uri, options)
    return committed


def test_two_writers_of_one_date_never_mix_and_a_reader_always_sees_one_whole_generation(target):
    uri, options = target
    partitions.write_tables(uri, tables(0, 10), {}, options)
    stop, problems, reads = threading.Event(), [], []

    def reader() -> None:
        while not stop.is_set():
            try:
                reads.append(assert_whole(partitions.require_current(uri, options), options))
            except (AssertionError, storage.StorageError) as e:
                # nothing is removed under a reader: retention keeps superseded generations for days
                problems.append(repr(e))

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        for round_ in range(6):
            a, b = 10 + 2 * round_, 11 + 2 * round_
            with ThreadPoolExecutor(2) as pool:
                first, second = pool.map(
                    lambda value: write_and_tidy(uri, tables(value, 30 + value), options),
                    (a, b),
                )
            current = partitions.current(uri, options)
            winner = max((first, second), key=lambda c: c.key)
            assert current.generation == winner.generation
            assert assert_whole(current, options) == (a if winner is first else b)
            loser = second if winner is first else first
            assert loser.superseded_by in (
                None,
                winner.generation,
            )  # it learns when its check sees the later commit
            assert assert_whole(partitions.pinned(uri, loser.generation, options), options) in (a, b)
    finally:
        stop.set()
        watcher.join()
    assert not problems, problems
    assert reads, "the reader never read"


def test_a_slow_writer_survives_reruns_and_retention_keeps_what_a_training_pinned(target):
    """Issue 31, items 1 and 2, on each store. A writer that started 9 h ago and still writes (its
    lease renewed) keeps its files through three reruns' housekeeping, then commits whole (judged by
    its age it was swept, and committed a manifest whose rows its files did not hold). Eight days
    later (the store's clock moved on) retention removes the superseded generations, except the one
    a training pinned; the current one and the pinned one read whole."""
    uri, options = target
    pinned = partitions.write_tables(uri, tables(1, 40), {}, options)
    retention.pin(uri, pinned.generation, "train-retrain_tabular-train-0123456789", options, kind="training")
    slow = partitions.new_generation(dt.datetime.now(dt.UTC) - dt.timedelta(hours=9))
    fsys, _ = storage.resolve(uri, options)
    with partitions.writer_lease(uri, slow, options):
        for name, table in tables(7, 40).items():  # its files land early, its commit comes last
            folder = storage.split_uri(partitions.output_uri(uri, slow, name))[1]
            fsys.create_dir(folder, recursive=True)
            with fsys.open_output_stream(f"{folder}/part-00000.parquet") as f:
                pq.write_table(table, f)
        reruns = [write_and_tidy(uri, tables(value, 40), options) for value in (2, 3, 4)]
        committed = partitions.commit(
            uri, slow, {"outputs": {"train": {"rows": 40}, "test": {"rows": 10}}}, options
        )
    assert partitions.current(uri, options).generation == slow and assert_whole(committed, options) == 7

    later = retention.store_now(uri, options) + dt.timedelta(days=8)
    plan = retention.plan(uri, options, retention.Policy(keep=1), now=later)
    assert sorted(r.name for r in plan) == sorted(c.generation for c in reruns)
    assert not retention.remove(plan, options)
    assert assert_whole(partitions.pinned(uri, pinned.generation, options), options) == 1
    assert assert_whole(partitions.current(uri, options), options) == 7
    with pytest.raises(storage.StorageError, match="removed by retention"):
        partitions.pinned(uri, reruns[0].generation, options)


def test_cos_throttling_during_the_commit_is_retried_and_the_data_is_whole(cos_server):
    options = storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                     access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    uri = f"cos://{BUCKET}/throttled-{uuid.uuid4().hex[:8]}/staged/dt=2026-11-21"
    cos_server.inject_faults(4, status=503, code="SlowDown")
    try:
        committed = partitions.write_tables(uri, tables(5, 100), {}, options)
    finally:
        cos_server.clear_faults()
    assert partitions.current(uri, options).generation == committed.generation
    assert assert_whole(committed, options) == 5


def test_a_commit_whose_manifest_landed_stays_current_and_whole_when_listing_the_commits_fails(
    cos_server, monkeypatch
):
    """Once the manifest is written the generation is current: a failure after it (listing
    ``_commits/`` to see whether a later writer won, here refused outright) is logged, never raised,
    so the writer does not discard the files its manifest makes current."""
    options = storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                     access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    uri = f"cos://{BUCKET}/unlisted-{uuid.uuid4().hex[:8]}/staged/dt=2026-11-23"
    before = partitions.write_tables(uri, tables(3, 100), {}, options)
    write = partitions._write_atomically

    def write_then_refuse_listings(*args):  # the manifest lands; then COS refuses the next listing
        write(*args)
        cos_server.inject_faults_on("GET", f"{partitions.COMMITS}/", 1, status=403, code="AccessDenied")

    monkeypatch.setattr(partitions, "_write_atomically", write_then_refuse_listings)
    try:
        committed = partitions.write_tables(uri, tables(4, 100), {}, options)
        assert not cos_server.unserved_faults(), "the commit never listed its commits"
    finally:
        cos_server.clear_faults()
    assert committed.superseded_by is None
    assert partitions.current(uri, options).generation == committed.generation != before.generation
    assert assert_whole(committed, options) == 4


def test_slow_cos_responses_during_the_commit_still_commit_whole(cos_server):
    options = storage.StorageOptions(endpoint_override=cos_server.endpoint, scheme="http", region=REGION,
                                     access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    uri = f"cos://{BUCKET}/slow-{uuid.uuid4().hex[:8]}/staged/dt=2026-11-22"
    cos_server.inject_delays(6, 1.5)
    try:
        committed = partitions.write_tables(uri, tables(6, 100), {}, options)
    finally:
        cos_server.clear_faults()
    assert partitions.current(uri, options).generation == committed.generation
    assert assert_whole(committed, options) == 6
