"""Housekeeping of produced partitions, from the Airflow side: the rules of
:mod:`emr_ray.cluster.retention` with what the model registry itself says each pin serves.

One code path for :class:`~emr_ray.operators.housekeeping.PartitionHousekeepingOperator` (and the
``partition_housekeeping`` DAG) and for the command line, which reads the same Airflow connections::

    python -m emr_ray.housekeeping sweep cos://bucket/staging/tabular                      # dry run
    python -m emr_ray.housekeeping sweep cos://bucket/staging/tabular --apply --keep-versions 3
    python -m emr_ray.housekeeping pin cos://bucket/staging/tabular/dt=2026-11-02 g2026... --holder audit-2026

Dry run by default: it says what it would remove and why, and which model versions keep which bytes.
No list of models is needed: a training's pin names its MLflow run, and the registry is asked which
versions came from it (:mod:`emr_ray.registry_lineage`). A generation a kept version needs (it holds an
alias, is among the newest of its model, or is recent: :class:`~emr_ray.cluster.model_retention.VersionPolicy`)
is never removed; when the registry cannot answer completely, no committed data is removed at all.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emr_ray.cluster import retention, storage
from emr_ray.cluster.model_retention import DEFAULT_KEEP_DAYS, DEFAULT_KEEP_NEWEST, VersionPolicy

log = logging.getLogger(__name__)


@dataclass
class Report:
    """What one housekeeping pass planned, removed, could not remove, and kept for model versions."""

    dry_run: bool
    planned: list[retention.Removal] = field(default_factory=list)
    failed: list[retention.Removal] = field(default_factory=list)
    kept: list[retention.Kept] = field(default_factory=list)
    #: why the registry's answer was not complete (then no committed data was removed)
    problems: list[str] = field(default_factory=list)

    def kept_bytes(self) -> dict[str, int]:
        """Bytes of the generations each model's kept versions hold (a generation counted once a model)."""
        seen: dict[str, dict[tuple[str, str], int]] = {}
        for k in self.kept:
            seen.setdefault(k.model, {})[(k.partition_uri, k.generation)] = k.bytes
        return {model: sum(sizes.values()) for model, sizes in sorted(seen.items())}

    def as_xcom(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for removal in self.planned:
            kinds[removal.kind] = kinds.get(removal.kind, 0) + 1
        return {
            "dry_run": self.dry_run,
            "planned": [r.describe() for r in self.planned],
            "by_kind": kinds,
            "removed": 0 if self.dry_run else len(self.planned) - len(self.failed),
            "failed": [r.describe() for r in self.failed],
            "kept": [k.describe() for k in self.kept],
            "kept_bytes_by_model": self.kept_bytes(),
            "problems": list(self.problems),
        }


def training_runs(dataset_uris: Sequence[str], options: storage.StorageOptions | None) -> set[str]:
    """The MLflow runs the training pins of every partition of ``dataset_uris`` name."""
    runs = set()
    for uri in dataset_uris:
        for partition_uri in retention.partitions_of(uri, options):
            runs |= {
                p.mlflow_run_id
                for p in retention.pins(partition_uri, options)
                if p.body.get("kind") == "training" and p.mlflow_run_id
            }
    return runs


def storage_options(cos_conn_id: str | None) -> storage.StorageOptions | None:
    """The storage options of a ``cos`` connection (None: none given, for file:// and hdfs://)."""
    if not cos_conn_id:
        return None
    from emr_ray.hooks.cos import COSHook

    return storage.StorageOptions(**COSHook(cos_conn_id).pyarrow_s3_options())


def housekeep(
    dataset_uris: Sequence[str],
    model_names: Sequence[str] = (),
    *,
    cos_conn_id: str | None = "cos_default",
    mlflow_conn_id: str = "mlflow_default",
    policy: retention.Policy | None = None,
    dry_run: bool = True,
) -> Report:
    """Plan (and without ``dry_run``, do) the housekeeping of every partition of ``dataset_uris``.

    :param model_names: models that must be readable besides those the registry lists (optional: a
        model named here that cannot be read makes the answer incomplete).
    """
    from emr_ray import registry_lineage
    from emr_ray.hooks.mlflow import MLflowHook

    policy = policy or retention.Policy()
    options = storage_options(cos_conn_id) if any(u.startswith("cos://") for u in dataset_uris) else None
    runs = training_runs(dataset_uris, options)
    references = registry_lineage.references(MLflowHook(mlflow_conn_id), runs, model_names)
    log.info(
        "The registry lists %d model version(s); %d training run(s) pinned data",
        len(references.versions),
        len(runs),
    )
    report = Report(dry_run=dry_run, problems=list(references.problems))
    for problem in report.problems:
        log.warning("Keeping all committed data: %s", problem)
    for uri in dataset_uris:
        swept = retention.sweep(uri, options, policy, references, dry_run=dry_run)
        report.planned += swept.planned
        report.failed += swept.failed
        report.kept += swept.kept
    verb = "Would remove" if dry_run else "Removed"
    for removal in report.planned:
        log.info("%s %s", verb if removal not in report.failed else "Could not remove", removal.describe())
    for kept in report.kept:
        log.info("Kept: %s (%d bytes)", kept.describe(), kept.bytes)
    for model, size in report.kept_bytes().items():
        log.info("Model %s: its kept versions hold %d bytes", model, size)
    log.info(
        "%s %d item(s) under %d dataset(s)%s",
        verb,
        len(report.planned) - len(report.failed),
        len(dataset_uris),
        " (dry run: nothing removed)" if dry_run else "",
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m emr_ray.housekeeping", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--cos-conn-id", default="cos_default", help="Airflow connection of the cos:// datasets"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    pin = sub.add_parser("pin", help="keep a generation whatever its age, until unpinned")
    unpin = sub.add_parser("unpin", help="drop a pin")
    for command in (pin, unpin):
        command.add_argument("partition_uri")
        command.add_argument("generation")
        command.add_argument("--holder", required=True, help="who holds the pin, e.g. audit-2026-q4")
    pin.add_argument("--reason", default="")
    sweep = sub.add_parser("sweep", help="plan (and with --apply, do) the housekeeping")
    sweep.add_argument("dataset_uris", nargs="+", help="dataset folders holding dt=... partitions")
    sweep.add_argument(
        "--model",
        action="append",
        default=[],
        help="a model that must be readable (optional: every model the registry lists is read anyway)",
    )
    sweep.add_argument(
        "--keep-versions",
        type=int,
        default=DEFAULT_KEEP_NEWEST,
        help="newest versions of each model whose data is kept",
    )
    sweep.add_argument(
        "--keep-version-days",
        type=float,
        default=DEFAULT_KEEP_DAYS,
        help="days a version keeps its data after it was registered",
    )
    sweep.add_argument("--mlflow-conn-id", default="mlflow_default")
    sweep.add_argument("--retain-days", type=float, default=retention.DEFAULT_RETAIN_S / 86400)
    sweep.add_argument("--keep", type=int, default=retention.DEFAULT_KEEP)
    sweep.add_argument("--apply", action="store_true", help="remove; without it, only say what would go")
    args = parser.parse_args(argv)
    if args.command in ("pin", "unpin"):
        options = storage_options(args.cos_conn_id) if args.partition_uri.startswith("cos://") else None
        if args.command == "pin":
            retention.pin(
                args.partition_uri, args.generation, args.holder, options, kind="manual", reason=args.reason
            )
        else:
            retention.unpin(args.partition_uri, args.generation, args.holder, options)
        log.info(
            "%sned %s of %s for %s",
            args.command.capitalize(),
            args.generation,
            args.partition_uri,
            args.holder,
        )
        return 0
    policy = retention.Policy(
        keep=args.keep,
        retain_s=args.retain_days * 86400,
        versions=VersionPolicy(args.keep_versions, args.keep_version_days),
    )
    report = housekeep(
        args.dataset_uris,
        args.model,
        cos_conn_id=args.cos_conn_id,
        mlflow_conn_id=args.mlflow_conn_id,
        policy=policy,
        dry_run=not args.apply,
    )
    verb = "Would remove" if report.dry_run else "Removed"
    for removal in report.planned:
        print(f"{'Could not remove' if removal in report.failed else verb} {removal.describe()}")
    for kept in report.kept:
        print(f"Kept: {kept.describe()}, {kept.bytes} bytes")
    for problem in report.problems:
        print(f"No committed data removed: {problem}")
    print(
        f"{verb} {len(report.planned) - len(report.failed)} item(s)"
        + (" (dry run: add --apply)" if report.dry_run else "")
    )
    return 1 if report.failed or report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
