"""Which model versions keep the data they were trained on: a policy people can state, decided without I/O.

A version keeps its training's input generations while any of these holds (:meth:`VersionPolicy.why_kept`):

- an alias points at it (``@champion``, ``@challenger``, ...), archived or not;
- it is among the newest ``keep_newest`` versions of its model (a rollback needs its data);
- it was registered less than ``keep_days`` ago.

(A person's pin keeps a generation on its own, until unpinned: :mod:`emr_ray.cluster.retention`.)

What the registry says arrives here as :class:`VersionFacts` and :class:`RunLineage`, gathered on the
Airflow side by :mod:`emr_ray.registry_lineage`. A training's pin names its MLflow run; the run names the
models it registered versions in (:data:`REGISTERED_MODELS_TAG`, written before each registration), and
those models are read directly: an answer that cannot be complete (a model this login may not read,
MLflow down) is a ``problem``, and a pin whose run has a problem is never released.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: MLflow run tag: the registered models a version of this run was registered in (a JSON list),
#: written by ``MLflowRegisterOperator`` *before* it registers, so the run always names them
REGISTERED_MODELS_TAG = "emr_ray.registered_models"
#: versions of each model always kept, newest first
DEFAULT_KEEP_NEWEST = 3
#: days a version keeps its data after it was registered, whatever else holds
DEFAULT_KEEP_DAYS = 7.0


@dataclass(frozen=True)
class VersionFacts:
    """One model version as the registry described it."""

    model: str
    version: str
    run_id: str | None
    registered_at: dt.datetime | None
    aliases: tuple[str, ...] = ()
    #: 0 for the newest version of its model, 1 for the one before, ...
    rank: int = 0
    #: ``(partition URI, generation)`` its ``data_uri`` and ``generation`` tags name, if any
    generations: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.model} v{self.version}"


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions keep their data (see the module's docstring); alias holders always do."""

    keep_newest: int = DEFAULT_KEEP_NEWEST
    keep_days: float = DEFAULT_KEEP_DAYS

    def __post_init__(self) -> None:
        if self.keep_newest < 1:
            raise ValueError(
                f"keep_newest={self.keep_newest}: keep at least the newest version of each model "
                "(a version being promoted is always the newest)."
            )
        if self.keep_days < 0:
            raise ValueError(f"keep_days={self.keep_days}: a number of days cannot be negative.")

    def why_kept(self, version: VersionFacts, now: dt.datetime) -> str | None:
        """Why ``version`` keeps its data at ``now``, or None when it no longer does."""
        if version.aliases:
            return "holds " + ", ".join(f"@{a}" for a in version.aliases)
        if version.rank < self.keep_newest:
            return f"among the newest {self.keep_newest} versions of {version.model}"
        if version.registered_at is not None and self.keep_days > 0:
            age = now - version.registered_at
            if age < dt.timedelta(days=self.keep_days):
                return f"registered {age.total_seconds() / 86400:.1f} days ago (kept {self.keep_days:g} days)"
        return None


@dataclass(frozen=True)
class RunLineage:
    """What the registry says of one training run: the versions registered from it, or why it cannot say."""

    run_id: str
    versions: tuple[VersionFacts, ...] = ()
    problem: str | None = None


def versions_of_model(
    model: str,
    versions: Iterable[tuple[str, str | None, int | None, Mapping[str, str]]],
    aliases: Mapping[str, str],
) -> list[VersionFacts]:
    """Facts of every version of ``model`` from ``(version, run id, creation ms, tags)`` rows and the
    model's aliases (alias -> version); ranks by version number, newest first."""
    rows = sorted(versions, key=lambda row: int(row[0]), reverse=True)
    by_version: dict[str, list[str]] = {}
    for alias, version in aliases.items():
        by_version.setdefault(str(version), []).append(str(alias))
    facts = []
    for rank, (version, run_id, created_ms, tags) in enumerate(rows):
        named: tuple[tuple[str, str], ...] = ()
        if tags.get("data_uri") and tags.get("generation"):
            named = ((tags["data_uri"].rstrip("/"), tags["generation"]),)
        registered = dt.datetime.fromtimestamp(created_ms / 1000, dt.UTC) if created_ms else None
        facts.append(
            VersionFacts(
                model,
                str(version),
                run_id or None,
                registered,
                tuple(sorted(by_version.get(str(version), ()))),
                rank,
                named,
            )
        )
    return facts


def registered_models(tags: Mapping[str, str]) -> list[str] | None:
    """The models a run's :data:`REGISTERED_MODELS_TAG` names (none when absent); None when the tag
    is not a JSON list (it then proves nothing)."""
    try:
        names = json.loads(tags.get(REGISTERED_MODELS_TAG) or "[]")
    except ValueError:
        return None
    return sorted({str(n) for n in names}) if isinstance(names, list) else None


def with_registered_model(tags: Mapping[str, str], model: str) -> str | None:
    """The tag's new value once ``model`` is added, or None when it names ``model`` already."""
    names = registered_models(tags) or []
    return None if model in names else json.dumps(sorted({*names, model}))
