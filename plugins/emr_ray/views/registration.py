"""What the plugin registers for the Retraining view, cheap to import: every Airflow process loads
the plugin file, and only the API server ever serves the view.

:class:`LazyApp` is the ASGI app Airflow mounts; it imports FastAPI, Airflow's API modules and
:mod:`emr_ray.views.app` on its first request, so the scheduler, the workers and the triggerer pay
nothing for it.
"""

from __future__ import annotations

from typing import Any

#: where Airflow's API server mounts the view's app (a plugin may not use /api, /ui, /auth, ...)
URL_PREFIX = "/emr-ray/retraining"
#: the tab's route inside the UI: /dags/<dag_id>/plugin/<DAG_TAB_ROUTE>; the nav entry's: /plugin/<NAV_ROUTE>
DAG_TAB_ROUTE = "retraining"
NAV_ROUTE = "retraining-dags"
#: a DAG's view inside the frame (where the nav page links: the frame cannot navigate the UI around it)
DAG_VIEW_URL = URL_PREFIX + "/dags/{dag_id}"


class LazyApp:
    """An ASGI app that builds the real one (:func:`emr_ray.views.app.create_app`) on first use."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from emr_ray.views.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


FASTAPI_APP = {"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "emr_ray retraining view"}
#: the tab on every DAG's page ({DAG_ID} is filled in by the UI) and the nav entry listing the DAGs
EXTERNAL_VIEWS = [
    {
        "name": "Retraining",
        "href": URL_PREFIX + "/dags/{DAG_ID}",
        "destination": "dag",
        "url_route": DAG_TAB_ROUTE,
    },
    {
        "name": "Retraining",
        "href": URL_PREFIX + "/",
        "destination": "nav",
        "category": "browse",
        "url_route": NAV_ROUTE,
    },
]
