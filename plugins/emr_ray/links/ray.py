"""Extra link "Ray Dashboard": the job page of the Ray job a task ran (stored in XCom at submit time)."""

from __future__ import annotations

from emr_ray.links.base import XComStoredLink


class RayJobLink(XComStoredLink):
    """Links a task to its Ray job in the dashboard."""

    name = "Ray Dashboard"
