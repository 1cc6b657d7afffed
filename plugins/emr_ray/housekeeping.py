"""Housekeeping of produced partitions, from the Airflow side: the rules of
:mod:`emr_ray.cluster.retention` with what the model registry still names.

One code path for :class:`~emr_ray.operators.housekeeping.PartitionHousekeepingOperator` (and the
``partition_housekeeping`` DAG) and for the command line, which reads the same Airflow connections::

    python -m emr_ray.housekeeping sweep cos://bucket/staging/tabular --model tabular-mlp          # dry run
    python -m emr_ray.housekeeping sweep cos://bucket/staging/tabular --model tabular-mlp --apply
    python -m emr_ray.housekeeping pin cos://bucket/staging/tabular/dt=2026-11-02 g2026... --holder audit-2026

Dry run by default: it says what it would remove and why. A generation a live model version of the
given models names (its ``data_uri`` and ``generation`` tags) is never removed; a training's pin is
released once no live version came from its run.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emr_ray.cluster import retention, storage

log = logging.getLogger(__name__)


@dataclass
class Report:
    """What one housekeeping pass planned, removed and could not remove."""

    dry_run: bool
    planned: list[retention.Removal] = field(default_factory=list)
    failed: list[retention.Removal] = field(default_factory=list)

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
        }


def model_references(mlflow_hook: Any, model_names: Sequence[str]) -> retention.References:
    """What the live versions of ``model_names`` name: their data generations and their runs."""
    generations, runs = set(), set()
    for name in model_names:
        for version in mlflow_hook.live_versions(name):
            tags = version.tags or {}
            if tags.get("data_uri") and tags.get("generation"):
                generations.add((tags["data_uri"].rstrip("/"), tags["generation"]))
            if version.run_id:
                runs.add(version.run_id)
    return retention.References(frozenset(generations), frozenset(runs), complete=bool(model_names))


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
    """Plan (and without ``dry_run``, do) the housekeeping of every partition of ``dataset_uris``."""
    references = retention.References()
    if model_names:
        from emr_ray.hooks.mlflow import MLflowHook

        references = model_references(MLflowHook(mlflow_conn_id), model_names)
        log.info("The registry names %d generation(s) through %d live run(s) of %s",
                 len(references.generations), len(references.live_runs), ", ".join(model_names))  # fmt: skip
    else:
        log.warning("No model names given: generations are kept for model versions only through their "
                    "trainings' pins, which are then never released")  # fmt: skip
    options = storage_options(cos_conn_id) if any(u.startswith("cos://") for u in dataset_uris) else None
    report = Report(dry_run=dry_run)
    for uri in dataset_uris:
        planned, failed = retention.sweep(
            uri, options, policy or retention.Policy(), references, dry_run=dry_run
        )
        report.planned += planned
        report.failed += failed
    verb = "Would remove" if dry_run else "Removed"
    for removal in report.planned:
        log.info("%s %s", verb if removal not in report.failed else "Could not remove", removal.describe())
    log.info("%s %d item(s) under %d dataset(s)%s", verb, len(report.planned) - len(report.failed),
             len(dataset_uris), " (dry run: nothing removed)" if dry_run else "")  # fmt: skip
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
        "--model", action="append", default=[], help="registered model whose versions keep data"
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
    policy = retention.Policy(keep=args.keep, retain_s=args.retain_days * 86400)
    report = housekeep(args.dataset_uris, args.model, cos_conn_id=args.cos_conn_id,
                       mlflow_conn_id=args.mlflow_conn_id, policy=policy, dry_run=not args.apply)  # fmt: skip
    verb = "Would remove" if report.dry_run else "Removed"
    for removal in report.planned:
        print(f"{'Could not remove' if removal in report.failed else verb} {removal.describe()}")
    print(
        f"{verb} {len(report.planned) - len(report.failed)} item(s)"
        + (" (dry run: add --apply)" if report.dry_run else "")
    )
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
