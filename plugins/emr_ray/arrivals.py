"""Which landed partitions need a run: an arrival event is delivered at least once, so a duplicate for a
partition already trained on exactly the same raw listing starts nothing and registers no second version.

The evidence is the registry's: ``MLflowRegisterOperator`` records on each version the raw partition's
identity its preprocessing was submitted for (``receipt.raw_input``: every file's name, size, ETag and
time, :mod:`emr_ray.hooks.input_identity`). A partition landed again (other files, even of the same
size) has another identity and runs; so does one no version records, or one whose listing cannot be
read (a run is never skipped without evidence).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from emr_ray.cluster import storage
from emr_ray.cluster.reuse import UNREADABLE

#: the version tag with the raw partition's identity (:mod:`emr_ray.receipt`)
RAW_INPUT_TAG = "receipt.raw_input"


def trained_on(identity: str | None, versions: Iterable[tuple[str, Mapping[str, str]]]) -> str | None:
    """The first version (of ``(version, tags)`` rows) whose training read exactly the raw listing
    ``identity``, or None; an unknown or unreadable identity, or an empty partition, matches nothing."""
    if not identity or identity.startswith(UNREADABLE) or identity == "no files":
        return None
    for version, tags in sorted(versions, key=lambda row: int(row[0])):
        if tags.get(RAW_INPUT_TAG) == identity:
            return version
    return None


def unprocessed(
    confs: list[dict[str, Any]], raw_uri: str, model: str, *, cos_conn_id: str, mlflow_conn_id: str, log: Any
) -> list[dict[str, Any]]:
    """The run confs of ``confs`` (one per landed partition) whose partition no version of ``model`` was
    trained on with the raw listing it has now; each skipped one is logged with the version that holds it.
    A conf that forces recomputation always runs."""
    from emr_ray.hooks.input_identity import partition_identity

    keep = []
    for conf in confs:
        partition = str(conf["partition"])
        if conf.get("force_recompute"):
            keep.append(conf)
            continue
        uri = storage.join(raw_uri, f"dt={partition}")
        try:
            identity = _identity(uri, cos_conn_id, partition_identity)
            version = trained_on(identity, _versions(mlflow_conn_id, model, partition))
        except Exception as e:  # no evidence: run it
            log.warning(
                "Could not tell whether %s was processed already (%s: %s); running it",
                uri,
                type(e).__name__,
                e,
            )
            keep.append(conf)
            continue
        if version is None:
            keep.append(conf)
        else:
            log.info(
                "Skipping the arrival of %s: %s v%s was trained on exactly this raw listing (%s); "
                "trigger retrain_tabular by hand with force_recompute to train again",
                uri,
                model,
                version,
                identity,
            )
    return keep


def _identity(uri: str, cos_conn_id: str, partition_identity: Any) -> str:
    if storage.split_uri(uri)[0] == "cos":
        from emr_ray.hooks.cos import COSHook

        return partition_identity(uri, cos_hook=COSHook(cos_conn_id))
    return partition_identity(uri)


def _versions(mlflow_conn_id: str, model: str, partition: str) -> list[tuple[str, dict[str, str]]]:
    from emr_ray.hooks.mlflow import MLflowHook

    hook = MLflowHook(mlflow_conn_id)
    return [(str(v.version), dict(v.tags or {})) for v in hook.versions_of_partition(model, partition)]
