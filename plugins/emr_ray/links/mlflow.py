"""Extra links from a task to the MLflow UI: the source run and the registered model version.

The operator computes each URL while it runs (only it knows the run and the version) and stores it
with :meth:`~emr_ray.links.base.XComStoredLink.persist`; an empty link when MLflow has no UI URL.
"""

from __future__ import annotations

from emr_ray.links.base import XComStoredLink


class MLflowRunLink(XComStoredLink):
    """The MLflow run a model was registered from."""

    name = "MLflow Run"


class MLflowModelVersionLink(XComStoredLink):
    """The registered model version the task created or reused."""

    name = "MLflow Model Version"
