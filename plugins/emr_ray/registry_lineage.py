"""What the model registry says each training's pin still serves, asked across all models (Airflow side).

Retention never learns what a live model needs from a list someone keeps: each training's pin names its
MLflow run; the run names the models it registered versions in (``MLflowRegisterOperator`` tags it
before registering); every model the login can list adds the versions found there. Each named model is
read directly, so a model this login may not read (MLflow's auth app hides it from searches) is a
*problem*, not an absence. Any problem, and MLflow down or failing, makes the answer incomplete, and an
incomplete answer removes no committed data (:func:`emr_ray.cluster.retention.sweep`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from emr_ray.cluster import model_retention, retention
from emr_ray.cluster.model_retention import RunLineage, VersionFacts

log = logging.getLogger(__name__)


def references(hook: Any, run_ids: Iterable[str], models: Sequence[str] = ()) -> retention.References:
    """The registry's answer for the trainings ``run_ids`` (their pins' runs) and every model it lists,
    plus ``models`` (read even when the search does not list them: a typo is then a problem)."""
    try:
        listed = hook.registered_model_names()
    except Exception as e:
        return retention.References(problems=(f"the registry could not be listed ({_error(e)})",), asked=True)
    lookup = _Models(hook)
    for name in (*listed, *models):
        lookup.read(name)
    runs = {run_id: _lineage(hook, lookup, run_id) for run_id in sorted(set(run_ids))}
    problems = lookup.problems + [f"run {r.run_id}: {r.problem}" for r in runs.values() if r.problem]
    return retention.References(runs, lookup.every(), tuple(problems), asked=True)


class _Models:
    """Each model read once; what could not be read is remembered as a problem."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook
        self.found: dict[str, list[VersionFacts] | None] = {}
        self.problems: list[str] = []

    def read(self, name: str) -> list[VersionFacts] | None:
        if name not in self.found:
            try:
                self.found[name] = self.hook.version_facts(name)
            except Exception as e:
                self.found[name] = None
                self.problems.append(_unreadable(name, e))
        return self.found[name]

    def every(self) -> tuple[VersionFacts, ...]:
        return tuple(v for versions in self.found.values() if versions for v in versions)


def _lineage(hook: Any, lookup: _Models, run_id: str) -> RunLineage:
    """The versions registered from ``run_id``, or why the registry cannot say."""
    try:
        tags = hook.run_tags(run_id)
    except Exception as e:
        return RunLineage(run_id, problem=f"its MLflow run could not be read ({_error(e)})")
    # a run deleted for good names nothing: what the registry still lists from it decides
    named = model_retention.registered_models(tags or {})
    if named is None:
        return RunLineage(
            run_id, problem=f"its tag {model_retention.REGISTERED_MODELS_TAG} is not a JSON list"
        )
    names = set(named) | {v.model for v in lookup.every() if v.run_id == run_id}
    versions: list[VersionFacts] = []
    for name in sorted(names):
        found = lookup.read(name)
        if found is None:
            return RunLineage(run_id, problem=f"it registered in {name!r}, which could not be read")
        versions += [v for v in found if v.run_id == run_id]
    return RunLineage(run_id, tuple(versions))


def _unreadable(name: str, e: Exception) -> str:
    from emr_ray.exceptions import MLflowAuthError

    if isinstance(e, MLflowAuthError):
        return (
            f"registered model {name!r} cannot be read with this login: grant it READ on the model "
            "(MLflow's auth app hides unreadable models from searches, so nothing is removed meanwhile)"
        )
    return f"registered model {name!r} could not be read ({_error(e)})"


def _error(e: Exception) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text[:300]}"
