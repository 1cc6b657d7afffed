"""A training run's checkpoints in its storage folder, for the warm worker group (cluster side).

Ray Train keeps a run's checkpoints itself; a warm worker group (:mod:`emr_ray.cluster.jobs.train_group`)
keeps them here, in the same folder and the same format (:mod:`emr_ray.cluster.train`'s ``state.pt`` and
``metrics.json``): ``<storage_path>/<run_name>/checkpoint_<epoch>``. ``metrics.json`` is written
last, so a checkpoint without it (a crash during the upload) is incomplete and never read.

- :func:`upload`: rank 0's checkpoint of an epoch, from a local folder.
- :class:`CheckpointStore`: the complete checkpoints, the latest (to resume from), the best by the
  spec's score, and the retention (``num_to_keep`` best, and always the latest).
- :class:`StoredCheckpoint`: what the job logs from, with Ray Train's ``Checkpoint``'s ``path`` and
  ``as_directory()``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from emr_ray.cluster import train as emr_train
from emr_ray.cluster.spec import CheckpointSpec

PREFIX = "checkpoint_"


def directory_name(epoch: int) -> str:
    return f"{PREFIX}epoch_{int(epoch):06d}"


def upload(local_dir: str, fsys: Any, run_path: str, epoch: int) -> str:
    """Copy a checkpoint folder to ``<run_path>/checkpoint_epoch_<epoch>``; metrics last. Returns its path."""
    target = f"{run_path.rstrip('/')}/{directory_name(epoch)}"
    fsys.delete_dir_contents(target, missing_dir_ok=True)  # an earlier, incomplete try of this epoch
    fsys.create_dir(target, recursive=True)
    names = sorted(os.listdir(local_dir), key=lambda name: name == emr_train.METRICS_FILE)
    for name in names:
        with (
            open(os.path.join(local_dir, name), "rb") as src,
            fsys.open_output_stream(f"{target}/{name}") as out,
        ):
            shutil.copyfileobj(src, out, length=1 << 20)
    return target


class BackgroundUploads:
    """A warm rank 0's checkpoints stored off the training step's path: one thread uploads them in
    the order they were reported (each whole, metrics last: :func:`upload`), then publishes the
    report and removes the local folder. A failed upload fails the call at the next report or at
    :meth:`finish`, which waits for every upload: a call never ends with a checkpoint half stored."""

    def __init__(self, fsys: Any, run_path: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.fsys, self.run_path = fsys, run_path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-upload")
        self._pending: list[Any] = []

    def submit(self, metrics: dict[str, Any], directory: str | None, publish: Any) -> None:
        self._raise_failed()

        def store() -> None:
            try:
                stored = upload(directory, self.fsys, self.run_path, metrics["epoch"]) if directory else None
            finally:
                if directory:
                    shutil.rmtree(directory, ignore_errors=True)
            publish({"metrics": metrics, "checkpoint": stored})

        self._pending.append(self._pool.submit(store))

    def settle(self, timeout_s: float) -> None:
        """Wait, at most ``timeout_s``, for the uploads submitted so far (their reports published)."""
        from concurrent.futures import wait

        wait(self._pending, timeout=timeout_s)

    def finish(self, raise_failed: bool = True) -> None:
        self._pool.shutdown(wait=True)
        if raise_failed:
            self._raise_failed()

    def _raise_failed(self) -> None:
        for future in self._pending:
            if future.done() and future.exception() is not None:
                raise RuntimeError(
                    f"Storing a checkpoint under {self.run_path} failed"
                ) from future.exception()


def download(fsys: Any, path: str, local_dir: str) -> str:
    """Copy a stored checkpoint into ``local_dir``; returns ``local_dir``."""
    from pyarrow import fs as pafs

    for info in fsys.get_file_info(pafs.FileSelector(path)):
        if info.type == pafs.FileType.File:
            with (
                fsys.open_input_stream(info.path) as src,
                open(os.path.join(local_dir, info.base_name), "wb") as out,
            ):
                shutil.copyfileobj(src, out, length=1 << 20)
    return local_dir


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint in the run's folder (``path`` in its filesystem, as Ray Train's ``Checkpoint``)."""

    fsys: Any
    path: str

    @contextmanager
    def as_directory(self) -> Iterator[str]:
        from pyarrow import fs as pafs

        if isinstance(self.fsys, pafs.LocalFileSystem):
            yield self.path
            return
        with tempfile.TemporaryDirectory() as tmp:
            yield download(self.fsys, self.path, tmp)


@dataclass
class CheckpointStore:
    """The complete checkpoints of one run folder, ranked by ``spec``'s score; with ``inputs`` (the
    fingerprint of the run's inputs), only those trained on them: a checkpoint of other inputs (or
    of none it names) is never resumed from, kept or reported as best."""

    fsys: Any
    run_path: str
    spec: CheckpointSpec
    inputs: str | None = None

    def complete(self) -> list[tuple[StoredCheckpoint, dict[str, Any]]]:
        """Every checkpoint with its metrics, oldest epoch first (incomplete ones and, with
        ``inputs``, those of other inputs left out)."""
        from pyarrow import fs as pafs

        found = []
        for info in self.fsys.get_file_info(pafs.FileSelector(self.run_path, allow_not_found=True)):
            if info.type != pafs.FileType.Directory or not info.base_name.startswith(PREFIX):
                continue
            metrics = read_json(self.fsys, f"{info.path}/{emr_train.METRICS_FILE}")
            if metrics is None or "epoch" not in metrics:
                continue
            if (
                self.inputs
                and (read_json(self.fsys, f"{info.path}/{emr_train.INPUTS_FILE}") or {}).get("fingerprint")
                != self.inputs
            ):
                continue
            found.append((StoredCheckpoint(self.fsys, info.path), metrics))
        return sorted(found, key=lambda pair: (int(pair[1]["epoch"]), pair[0].path))

    def latest(self) -> tuple[StoredCheckpoint, dict[str, Any]] | None:
        found = self.complete()
        return found[-1] if found else None

    def ranked(
        self, found: list[tuple[StoredCheckpoint, dict[str, Any]]] | None = None
    ) -> list[tuple[StoredCheckpoint, dict[str, Any]]]:
        """Best first by the score attribute (checkpoints without it last, newest first among equals);
        ``found``: the :meth:`complete` list when the caller has it already."""
        attribute, sign = self.spec.score_attribute, (1 if self.spec.score_order == "min" else -1)

        def key(pair: tuple[StoredCheckpoint, dict[str, Any]]) -> tuple[int, float, int]:
            value = pair[1].get(attribute)
            if not isinstance(value, (int, float)):
                return (1, 0.0, -int(pair[1]["epoch"]))
            return (0, sign * float(value), -int(pair[1]["epoch"]))

        return sorted(self.complete() if found is None else found, key=key)

    def retain(self) -> list[tuple[StoredCheckpoint, dict[str, Any]]]:
        """Delete all but the ``num_to_keep`` best and the latest; returns what is kept, best first."""
        found = self.complete()  # one listing for the ranking and the latest
        ranked = self.ranked(found)
        if self.spec.num_to_keep is None:
            return ranked
        latest = found[-1] if found else None
        kept = ranked[: self.spec.num_to_keep]
        for checkpoint, metrics in ranked[self.spec.num_to_keep :]:
            if latest and checkpoint.path == latest[0].path:
                kept.append((checkpoint, metrics))
            else:
                self.fsys.delete_dir(checkpoint.path)
        return kept


def read_json(fsys: Any, path: str) -> dict[str, Any] | None:
    """The JSON object of a checkpoint file on ``fsys`` (``metrics.json``, ``inputs.json``), or None
    when it is missing or unreadable (:func:`emr_ray.cluster.train.parse_json_object`)."""
    from pyarrow import fs as pafs

    if fsys.get_file_info(path).type != pafs.FileType.File:
        return None
    with fsys.open_input_stream(path) as f:
        return emr_train.parse_json_object(f.read(), path)
