"""Commit time against data size (issue 35, item 1), before and after, side by side.

For each store (``file://`` and the COS stand-in, run as its own process) and each row count, one
generation of the tabular shape (16 float32 features + an int64 label, in 8 Parquet files, as a
Spark output with a fixed partition count is) is written once through the recording writer, then
committed again and again, alternating:

- ``before``: ``partitions.commit`` as of commit 2cad8a3, loaded from git: it lists, then reads and
  hashes every byte (sha256) and reads the footers;
- ``after``: today's ``partitions.commit`` with the writer's records (size, rows, sha256 taken as
  the bytes went out): one listing, compared, no data byte read;
- ``after_listed``: today's commit of files nobody recorded (Spark's own writer on ``file://`` and
  HDFS): one listing (size, modification time) and the footers.

Readers are timed too: ``dataset_files`` by default (sizes) and with ``verify=True`` (reads every
byte). The writer's cost of recording is the recorded write against a plain one of the same table
just before it, at the sizes of ``--overhead-rows``. Files stay in the page cache (they were just written, as a commit finds them).
Prints a table with ratios and writes ``bench/results/commit-<time>.json``.

    bash scripts/loopback.sh .venv/bin/python -m bench.commit --rows 1000000,10000000,50000000
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench._common import REPO, STATE, machine, table, write_json

BEFORE_COMMIT = "2cad8a3"  # the last commit whose partitions.commit hashed every byte
FILES = 8
COLUMNS = 16


@functools.cache
def before_partitions() -> Any:
    """``emr_ray.cluster.partitions`` as it was at :data:`BEFORE_COMMIT`, as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{BEFORE_COMMIT}:plugins/emr_ray/cluster/partitions.py"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    spec = importlib.util.spec_from_loader("emr_ray_partitions_before", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    exec(compile(source, f"partitions.py@{BEFORE_COMMIT}", "exec"), module.__dict__)
    return module


def start_cos() -> tuple[subprocess.Popen, Any]:
    """The COS stand-in in a process of its own (as in the demo), and the options that reach it."""
    from devstack.constants import BUCKET, REGION, SECRET_ID, SECRET_KEY
    from emr_ray.cluster import storage

    port_file = STATE / f"cos-{uuid.uuid4().hex[:8]}.port"
    log = open(STATE / "cos-server.log", "w")  # noqa: SIM115 - lives as long as the server
    server = subprocess.Popen(
        [sys.executable, "-m", "devstack.cos_server", "--bucket", BUCKET, "--port-file", str(port_file)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    for _ in range(300):
        if port_file.exists():
            break
        if server.poll() is not None:
            raise RuntimeError(f"the COS stand-in exited; see {STATE / 'cos-server.log'}")
        time.sleep(0.1)
    options = storage.StorageOptions(endpoint_override=f"127.0.0.1:{port_file.read_text()}", scheme="http",
                                     region=REGION, access_key=SECRET_ID, secret_key=SECRET_KEY)  # fmt: skip
    return server, options


def write_generation(
    partition: str, rows: int, options: Any, *, plain_too: bool
) -> tuple[str, list[dict], float, float | None]:
    """One generation of ``rows`` rows in :data:`FILES` files through the recording writer:
    (generation, records, seconds, plain seconds). With ``plain_too`` each file is also written
    plainly (same table, elsewhere, then removed; which goes first alternates): the recording's cost
    under the same load."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from emr_ray.cluster import file_records, partitions, storage

    generation, scratch = partitions.new_generation(), partitions.new_generation()
    fsys, _ = storage.resolve(partition, options)
    _, folder = storage.split_uri(partitions.output_uri(partition, generation, "train"))
    _, plain_folder = storage.split_uri(partitions.output_uri(partition, scratch, "train"))
    fsys.create_dir(folder, recursive=True)
    fsys.create_dir(plain_folder, recursive=True)
    rng = np.random.default_rng(rows)
    records, recorded_s, plain_s = [], 0.0, 0.0
    for i in range(FILES):
        n = rows // FILES + (1 if i < rows % FILES else 0)
        x = rng.standard_normal((n, COLUMNS), dtype=np.float32)
        batch = pa.table({f"f{j}": x[:, j] for j in range(COLUMNS)} | {"label": rng.integers(0, 2, n)})
        name = f"part-{i:05d}.parquet"
        for recorded in (True, False) if i % 2 else (False, True):  # which goes first alternates
            if not (recorded or plain_too):
                continue
            started = time.perf_counter()
            if recorded:
                with file_records.RecordingFile(fsys, f"{folder}/{name}") as f:
                    pq.write_table(batch, f)
                recorded_s += time.perf_counter() - started
                records.append(f.record(name, n))
            else:
                with fsys.open_output_stream(f"{plain_folder}/{name}") as out:
                    pq.write_table(batch, out)
                plain_s += time.perf_counter() - started
                fsys.delete_file(f"{plain_folder}/{name}")
    partitions.discard(partition, scratch, options)
    return generation, records, recorded_s, plain_s if plain_too else None


def sample(started: float) -> dict[str, float]:
    """Seconds since ``started`` (to the microsecond: a commit can take a millisecond) and the load."""
    return {"seconds": round(time.perf_counter() - started, 6), "load1": round(os.getloadavg()[0], 2)}


def measure(store: str, partition: str, rows: int, options: Any, args: argparse.Namespace) -> dict[str, Any]:
    from emr_ray.cluster import partitions, storage

    before = before_partitions()
    result: dict[str, Any] = {"store": store, "rows": rows}
    generation, records, result["write_recorded_s"], result["write_plain_s"] = write_generation(
        partition, rows, options, plain_too=rows in args.overhead_rows
    )
    result["bytes"] = sum(r["size"] for r in records)
    manifest = {"outputs": {"train": {"rows": rows}}}
    recorded = {"outputs": {"train": {"rows": rows, "files": records}}}
    contenders = {
        "before": lambda: before.commit(partition, generation, manifest, options),
        "after": lambda: partitions.commit(partition, generation, recorded, options),
        "after_listed": lambda: partitions.commit(partition, generation, manifest, options),
    }
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in [*contenders, "read", "read_verify"]}
    committed = None
    for _ in range(args.repeat):
        for key, run in contenders.items():
            started = time.perf_counter()
            done = run()
            runs[key].append(sample(started))
            committed = done if key == "after" else committed
        assert committed is not None and committed.outputs["train"]["files"][0]["checksum"] == "sha256"
        for key, verify in (("read", False), ("read_verify", True)):
            started = time.perf_counter()
            partitions.dataset_files(committed, "train", options, verify=verify)
            runs[key].append(sample(started))
    for key, samples in runs.items():
        result[f"{key}_s"] = statistics.median(s["seconds"] for s in samples)
        result[f"{key}_runs"] = samples
    fsys, root = storage.resolve(partition, options)
    fsys.delete_dir(root)  # the next size starts from an empty partition (and the stand-in's memory)
    return result


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def report(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        rows.append([
            r["store"], f"{r['rows'] / 1e6:g}M", f"{r['bytes'] / 1e6:.0f} MB",
            ms(r["before_s"]), ms(r["after_s"]), ms(r["after_listed_s"]),
            f"{r['before_s'] / r['after_s']:.0f}x",
            ms(r["read_s"]), ms(r["read_verify_s"]),
            f"{r['write_recorded_s']:.1f}",
            f"{r['write_recorded_s'] / r['write_plain_s']:.2f}x" if r.get("write_plain_s") else "-",
        ])  # fmt: skip
    lines = [table(["store", "rows", "data", "before", "after", "after_listed", "before/after",
                    "read", "read verify", "write s", "recorded/plain write"], rows)]  # fmt: skip
    for store in dict.fromkeys(r["store"] for r in results):
        mine = [r for r in results if r["store"] == store]
        small, large = mine[0], mine[-1]
        for key in ("before", "after", "after_listed"):
            lines.append(f"{store} {key}: {large['rows'] / small['rows']:g}x the rows -> "
                         f"{large[f'{key}_s'] / small[f'{key}_s']:.2f}x the commit time")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1000000,10000000,50000000", help="row counts, comma-separated")
    parser.add_argument("--stores", default="file,cos", help="file and/or cos")
    parser.add_argument("--cos-rows", help="row counts on the COS stand-in (default: --rows)")
    parser.add_argument("--repeat", type=int, default=3, help="commits per contender (medians)")
    parser.add_argument(
        "--overhead-rows", default="1000000,10000000", help="sizes that also time a plain write"
    )
    args = parser.parse_args(argv)
    sizes = [int(v) for v in args.rows.split(",") if v]
    cos_sizes = [int(v) for v in (args.cos_rows or args.rows).split(",") if v]
    args.overhead_rows = {int(v) for v in args.overhead_rows.split(",") if v}
    STATE.mkdir(parents=True, exist_ok=True)
    info = machine()
    results = []
    server = None
    try:
        for store in args.stores.split(","):
            options = None
            if store == "cos":
                from devstack.constants import BUCKET

                server, options = start_cos()
                base = f"cos://{BUCKET}/bench-commit-{uuid.uuid4().hex[:8]}"
            else:
                folder = STATE / "commit"
                shutil.rmtree(folder, ignore_errors=True)
                base = f"file://{folder}"
            for rows in cos_sizes if store == "cos" else sizes:
                partition = f"{base}/staged/rows-{rows}/dt=2026-12-01"
                results.append(measure(store, partition, rows, options, args))
                r = results[-1]
                print(f"{store} {rows}: before {ms(r['before_s'])}, after {ms(r['after_s'])}, "
                      f"read with verify {ms(r['read_verify_s'])}", flush=True)  # fmt: skip
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
                server = None
    finally:
        if server is not None:
            server.terminate()
    text = report(results)
    print(text)
    print(
        f"load average at start {info['loadavg_at_start']}, at end {[round(v, 2) for v in os.getloadavg()]}"
    )
    path = write_json(f"commit-{time.strftime('%Y%m%d-%H%M%S')}.json",
                      {"machine": info, "args": {**vars(args), "overhead_rows": sorted(args.overhead_rows)},
                       "results": results, "report": text})  # fmt: skip
    print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
