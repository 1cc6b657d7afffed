"""What a writer records of each data file as it writes it, so that a commit lists and compares
instead of reading the data back, and what a reader checks of those records on demand.

A record is one file entry of a manifest (:mod:`emr_ray.cluster.partitions`): ``path``, ``size``,
``rows``, and a checksum whose kind the entry names in ``checksum``:

- ``sha256``: of the file's bytes, computed by the writer as they went out (:class:`RecordingFile`).
  Manifests written before the kind was named carry ``sha256`` alone; they read as this kind.
- ``mtime``: the store's modification time (``mtime_ns``), taken from the commit's listing for files
  whose writer recorded nothing (Spark's own Parquet writer on ``file://`` and HDFS). A rewrite or a
  copy changes it; it proves nothing about the content.

Why: hashing at commit time read every byte of a generation through one process (3.7 s for 329 MB
on the COS stand-in, growing with the data); hashing while writing costs the writers a pass over
bytes they hold anyway, in parallel, and the commit stays a listing (bench/commit.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

SHA256 = "sha256"
MTIME = "mtime"


class RecordingFile:
    """A writable binary file on ``fsys`` that counts and hashes the bytes it passes on.

    Hand it to ``pyarrow.parquet.write_table`` or ``ParquetWriter``, close it, then take its
    :meth:`record`. Kept free of other ``emr_ray`` imports: Spark tasks carry it by value.
    """

    closed = False

    def __init__(self, fsys: Any, path: str) -> None:
        self._out = fsys.open_output_stream(path)
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._digest.update(view)
        self._out.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._out.flush()

    def close(self) -> None:
        if not self.closed:
            self._out.close()  # on object storage: the upload completes here or raises
            self.closed = True

    def __enter__(self) -> RecordingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, name: str, rows: int) -> dict[str, Any]:
        """The manifest entry of the closed file, ``name`` relative to its output folder."""
        return {
            "path": name,
            "size": self.size,
            "rows": rows,
            "checksum": SHA256,
            SHA256: self._digest.hexdigest(),
        }


def kind(entry: dict[str, Any]) -> str | None:
    """The checksum kind a manifest's file entry carries (None: size only, as legacy partitions)."""
    return entry.get("checksum") or (SHA256 if SHA256 in entry else None)


def listed(path: str, info: Any) -> dict[str, Any]:
    """The entry of a file its writer did not record: size and modification time, from a listing."""
    return {"path": path, "size": info.size, "checksum": MTIME, "mtime_ns": info.mtime_ns}


def compare(output: str, recorded: list[dict[str, Any]], found: dict[str, Any]) -> list[str]:
    """What is wrong between a writer's records of ``output`` and the files ``found`` there (name ->
    listing), each as a sentence; empty when every recorded file is there at its size, and only those."""
    problems = []
    names = {str(r.get("path")) for r in recorded}
    for entry in recorded:
        info = found.get(str(entry.get("path")))
        if info is None:
            problems.append(f"{output}/{entry.get('path')} was written but is missing")
        elif info.size != entry.get("size"):
            problems.append(
                f"{output}/{entry['path']} is {info.size} bytes, its writer wrote {entry.get('size')}"
            )
    problems += [
        f"{output}/{name} is there but its writer did not write it" for name in sorted(set(found) - names)
    ]
    return problems


def mismatch(fsys: Any, path: str, entry: dict[str, Any], info: Any) -> str | None:
    """Why the file at ``path`` (listed as ``info``) is not what ``entry`` recorded, or None.

    ``sha256`` reads every byte (the cost of ``verify=True``); ``mtime`` compares the listing's.
    """
    found = kind(entry)
    if found == SHA256:
        digest = hashlib.sha256()
        with fsys.open_input_stream(path) as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
        if digest.hexdigest() != entry[SHA256]:
            return f"its sha256 is {digest.hexdigest()}, its manifest says {entry[SHA256]}"
    elif found == MTIME and info.mtime_ns != entry.get("mtime_ns"):
        return f"it was modified at {info.mtime_ns} ns, its manifest says {entry.get('mtime_ns')}"
    return None
