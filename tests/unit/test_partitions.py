"""The generation protocol on the local filesystem: whole or nothing, pinned reads, commit order, old layout.

What is removed and when (retention by reference and time) is in ``test_retention.py``.

The same protocol on the COS stand-in and the WebHDFS stand-in, with crashes and two writers at
once, is in ``tests/integration/test_partition_faults.py``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os

import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq
import pytest

from emr_ray.cluster import file_records, partitions, retention, storage


def rows(n: int, start: int = 0) -> pa.Table:
    return pa.table({"x": list(range(start, start + n))})


def read_all(committed: partitions.Committed, output: str) -> list[int]:
    files = partitions.dataset_files(committed, output)
    return [v for path, _ in files for v in pq.read_table(path).column("x").to_pylist()]


@pytest.fixture
def partition(tmp_path) -> str:
    return f"file://{tmp_path}/staging/tabular/dt=2026-11-02"


def test_nothing_is_current_until_the_manifest_is_written(partition):
    generation = partitions.new_generation()
    folder = storage.split_uri(partitions.output_uri(partition, generation, "train"))[1]
    os.makedirs(folder)
    pq.write_table(rows(5), f"{folder}/part-0.parquet")
    assert partitions.current(partition) is None
    committed = partitions.commit(partition, generation, {"outputs": {"train": {"rows": 5}}})
    assert partitions.current(partition) == committed
    assert read_all(committed, "train") == [0, 1, 2, 3, 4]
    [entry] = committed.outputs["train"]["files"]
    path = f"{storage.split_uri(partition)[1]}/{entry['path']}"
    # written by hand, not recorded: described from the listing (no byte read), rows from the footer
    assert entry == {"path": entry["path"], "size": os.path.getsize(path), "checksum": "mtime",
                     "mtime_ns": os.stat(path).st_mtime_ns}  # fmt: skip
    assert committed.manifest["format"] == "emr_ray.partition/3"


def test_a_rerun_makes_a_new_generation_current_and_the_pinned_one_stays_readable(partition):
    first = partitions.write_tables(partition, {"train": rows(5)}, {})
    second = partitions.write_tables(partition, {"train": rows(7, 100)}, {})
    assert partitions.current(partition).generation == second.generation
    assert read_all(partitions.pinned(partition, first.generation), "train") == list(range(5))
    assert first.digest() != second.digest()


def test_commit_order_follows_what_the_writers_saw_not_their_clocks(partition):
    """A writer whose clock runs years ahead commits first; the next writer, with a right clock,
    commits after it and is current: its key's sequence is one above what it listed."""
    ahead = partitions.new_generation(dt.datetime(2031, 1, 1, tzinfo=dt.UTC))
    folder = storage.split_uri(partitions.output_uri(partition, ahead, "train"))[1]
    os.makedirs(folder)
    pq.write_table(rows(3), f"{folder}/part-0.parquet")
    first = partitions.commit(partition, ahead, {"outputs": {"train": {"rows": 3}}})
    second = partitions.write_tables(partition, {"train": rows(4)}, {})
    assert (first.key[:11], second.key[:11]) == ("c0000000001", "c0000000002")
    assert partitions.current(partition).generation == second.generation
    assert first.superseded_by is None and second.superseded_by is None


def test_a_file_dropped_into_commits_is_never_current(partition):
    """Only names this module writes, with a manifest of their own generation, are commits."""
    good = partitions.write_tables(partition, {"train": rows(2)}, {})
    commits = f"{storage.split_uri(partition)[1]}/_commits"
    for name, body in [("zzz-latest.json", {"generation": "x", "outputs": {}}),
                       ("c9999999999-g20991231T000000-0badc0de.json", {"generation": good.generation, "outputs": {}}),
                       ("c9999999998-g20991231T000000-00000000.json", "not json")]:  # fmt: skip
        with open(f"{commits}/{name}", "w") as f:
            f.write(body if isinstance(body, str) else json.dumps(body))
    assert partitions.current(partition).generation == good.generation
    assert read_all(partitions.current(partition), "train") == [0, 1]


def test_a_commit_refuses_rows_its_files_do_not_hold(partition):
    """Files swept or added while the generation was written: the manifest would lie, so no commit."""
    generation = partitions.new_generation()
    folder = storage.split_uri(partitions.output_uri(partition, generation, "train"))[1]
    os.makedirs(folder)
    pq.write_table(rows(5), f"{folder}/part-0.parquet")
    with pytest.raises(storage.StorageError, match="declares 7 rows but its 1 file.s. hold 5"):
        partitions.commit(partition, generation, {"outputs": {"train": {"rows": 7}}})
    assert partitions.current(partition) is None
    with pytest.raises(storage.StorageError, match="is not a generation id"):
        partitions.commit(partition, "../elsewhere", {"outputs": {"train": {"rows": 5}}})


def test_a_writer_records_each_file_as_it_writes_it_and_the_commit_keeps_those_records(partition):
    """Size, rows and the sha256 of the bytes that went out: the commit lists, it reads nothing back."""
    committed = partitions.write_tables(partition, {"train": rows(50)}, {})
    [entry] = committed.outputs["train"]["files"]
    with open(f"{storage.split_uri(partition)[1]}/{entry['path']}", "rb") as f:
        data = f.read()
    assert entry == {"path": f"_generations/{committed.generation}/train/part-00000.parquet", "size": len(data),
                     "rows": 50, "checksum": "sha256", "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip


def written_by_hand(partition: str, names: list[str], n: int = 5) -> tuple[str, list[dict]]:
    """A generation with ``names`` written, and the records a writer would have taken of them."""
    generation = partitions.new_generation()
    folder = storage.split_uri(partitions.output_uri(partition, generation, "train"))[1]
    os.makedirs(folder)
    records = []
    for name in names:
        with file_records.RecordingFile(pyarrow.fs.LocalFileSystem(), f"{folder}/{name}") as f:
            pq.write_table(rows(n), f)
        records.append(f.record(name, n))
    return generation, records


def test_a_commit_refuses_files_its_writer_did_not_write_missing_or_short(partition):
    generation, records = written_by_hand(partition, ["part-0.parquet", "part-1.parquet"])
    folder = storage.split_uri(partitions.output_uri(partition, generation, "train"))[1]
    pq.write_table(rows(3), f"{folder}/part-9.parquet")  # a second writer on this generation
    with open(f"{folder}/part-1.parquet", "r+b") as f:
        f.truncate(100)
    os.remove(f"{folder}/part-0.parquet")
    with pytest.raises(storage.StorageError, match=(
        "train/part-0.parquet was written but is missing; "
        "train/part-1.parquet is 100 bytes, its writer wrote [0-9]+; "
        "train/part-9.parquet is there but its writer did not write it")):  # fmt: skip
        partitions.commit(partition, generation, {"outputs": {"train": {"rows": 10, "files": records}}})
    assert partitions.current(partition) is None


def test_a_commit_refuses_rows_its_writer_did_not_record(partition):
    generation, records = written_by_hand(partition, ["part-0.parquet", "part-1.parquet"])
    with pytest.raises(storage.StorageError, match="declares 11 rows but its 2 file.s. hold 10"):
        partitions.commit(partition, generation, {"outputs": {"train": {"rows": 11, "files": records}}})


def test_a_reader_verifies_checksums_on_demand_and_size_only_by_default(partition):
    """A same-size change passes the default size check; ``verify=True`` reads the bytes and refuses it.
    A manifest of the previous format (``sha256`` alone, no kind) verifies the same way."""
    committed = partitions.write_tables(partition, {"train": rows(50)}, {})
    assert partitions.dataset_files(committed, "train", verify=True)
    [entry] = committed.outputs["train"]["files"]
    old = dataclasses.replace(committed, manifest={**committed.manifest, "outputs": {"train": {
        "files": [{"path": entry["path"], "size": entry["size"], "sha256": entry["sha256"]}]}}})  # fmt: skip
    assert partitions.dataset_files(old, "train", verify=True) == partitions.dataset_files(committed, "train")
    path = f"{storage.split_uri(partition)[1]}/{entry['path']}"
    with open(path, "r+b") as f:
        f.seek(entry["size"] // 2)
        byte = f.read(1)
        f.seek(entry["size"] // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert partitions.dataset_files(committed, "train") == [(path, entry["size"])]
    for manifest in (committed, old):
        with pytest.raises(storage.StorageError, match="its sha256 is [0-9a-f]{64}, its manifest says"):
            partitions.dataset_files(manifest, "train", verify=True)


def test_a_file_written_by_hand_is_verified_by_its_modification_time(partition):
    generation, _ = written_by_hand(partition, ["part-0.parquet"])
    committed = partitions.commit(partition, generation, {"outputs": {"train": {"rows": 5}}})
    [(path, _)] = partitions.dataset_files(committed, "train", verify=True)
    os.utime(path, ns=(0, 0))
    with pytest.raises(storage.StorageError, match="it was modified at 0 ns, its manifest says"):
        partitions.dataset_files(committed, "train", verify=True)


def test_a_file_changed_behind_the_manifest_is_refused(partition):
    committed = partitions.write_tables(partition, {"train": rows(50)}, {})
    [entry] = committed.outputs["train"]["files"]
    with open(f"{storage.split_uri(partition)[1]}/{entry['path']}", "ab") as f:
        f.write(b"x")
    with pytest.raises(storage.StorageError, match="manifest says .* bytes: the partition was changed"):
        partitions.dataset_files(committed, "train")


def test_an_output_uri_leads_back_to_its_pinned_generation(partition):
    committed = partitions.write_tables(partition, {"train": rows(3), "test": rows(1)}, {})
    found, output = partitions.for_output_uri(committed.output_uri("test"))
    assert (found.generation, output) == (committed.generation, "test")
    with pytest.raises(storage.StorageError, match="not an output of a committed generation"):
        partitions.for_output_uri(f"{partition}/test")


def test_a_partition_of_the_previous_layout_is_read_then_replaced(partition):
    root = storage.split_uri(partition)[1]
    os.makedirs(f"{root}/train")
    pq.write_table(rows(4), f"{root}/train/part-0.parquet")
    with open(f"{root}/_manifest.json", "w") as f:
        json.dump({"outputs": {"train": {"rows": 4}}}, f)
    open(f"{root}/_SUCCESS", "w").close()
    os.makedirs(f"{root}/../_tmp_dt=2026-11-02_0123456789ab")  # a temporary its old commit left behind
    legacy = partitions.current(partition)
    assert legacy.generation == partitions.LEGACY and read_all(legacy, "train") == [0, 1, 2, 3]
    partitions.write_tables(partition, {"train": rows(2)}, {})
    retention.tidy(partition)  # the writer's own clean-up: temporaries, never committed data
    assert not any(n.startswith("_tmp_") for n in os.listdir(f"{root}/.."))
    assert "_SUCCESS" in os.listdir(root)
    retention.remove(retention.plan(partition))  # the sweep removes the superseded layout
    assert sorted(os.listdir(root)) == ["_commits", "_generations"]


def test_an_empty_output_is_not_committed(partition):
    generation = partitions.new_generation()
    os.makedirs(storage.split_uri(partitions.output_uri(partition, generation, "train"))[1])
    with pytest.raises(storage.StorageError, match="has no data files"):
        partitions.commit(partition, generation, {"outputs": {"train": {"rows": 0}}})
    assert partitions.current(partition) is None


def test_a_manifest_write_that_raised_but_landed_is_committed(partition, monkeypatch):
    """The write's answer was lost after it landed (a dropped connection): the commit reads the
    manifest back and reports it committed, so its writer keeps the files."""
    write = partitions._write_atomically

    def lands_then_fails(*args):
        write(*args)
        raise OSError("connection reset after the upload")

    monkeypatch.setattr(partitions, "_write_atomically", lands_then_fails)
    committed = partitions.write_tables(partition, {"train": rows(5)}, {})
    assert partitions.current(partition) == committed and read_all(committed, "train") == list(range(5))


def test_a_manifest_write_that_raised_and_cannot_be_read_back_is_of_unknown_state(partition, monkeypatch):
    """Neither the write's answer nor a read-back: the writer must not discard (CommitStateUnknown);
    a write known to have failed raises its own error, and the writer cleans up as before."""

    def fails(*args):
        raise OSError("connection reset")

    monkeypatch.setattr(partitions, "_write_atomically", fails)
    with pytest.raises(OSError, match="connection reset") as failed:
        partitions.write_tables(partition, {"train": rows(5)}, {})
    assert not isinstance(failed.value, partitions.CommitStateUnknown)  # nothing landed: discard is safe

    # the read-back fails too (here: the store cannot even be reached): unknown, and said so
    with pytest.raises(partitions.CommitStateUnknown, match="may be current, so its files are kept"):
        partitions._landed("cos://bucket/staged/dt=2026-11-02", "_commits/k.json", None, OSError("reset"))
