"""The Retraining view's routes: a FastAPI app that Airflow's API server mounts (see
:mod:`emr_ray.views.registration`), behind Airflow's own authentication and authorization.

Each route asks Airflow's auth manager, through the API server's own dependencies
(``requires_access_dag``, ``get_user``): a DAG's page and its JSON need read access to the DAG, its
runs, task instances and XComs; the index lists only the retraining DAGs the user may read. The JWT
comes as Airflow's UI sends it (its cookie, inside the UI's frame) or as a bearer token (the REST
API's). Routes are sync: FastAPI runs them in its thread pool; MLflow is read in the view's own threads
within each page's budget (:mod:`emr_ray.views.mlflow_reads`), so a slow MLflow holds none of Airflow's.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse

from emr_ray.views import page, sources
from emr_ray.views.mlflow_reads import READS
from emr_ray.views.model import (
    MAX_PAGE_SIZE,
    PAGE_SIZE,
    FilterError,
    Filters,
    RetrainingView,
    build_view,
    task_kind,
)
from emr_ray.views.registration import DAG_VIEW_URL

#: on every answer: the page runs no script and loads nothing (its plots are inline SVG, its style inline);
#: its filter form submits to itself; only Airflow's own pages may frame it
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
        "frame-ancestors 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

READ_DAG = [
    Depends(requires_access_dag("GET")),
    Depends(requires_access_dag("GET", DagAccessEntity.RUN)),
    Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)),
    Depends(requires_access_dag("GET", DagAccessEntity.XCOM)),
]


#: the query parameters of a DAG's page and its JSON (module level: FastAPI resolves them by name)
From = Annotated[str | None, Query(alias="from")]
To = Annotated[str | None, Query(alias="to")]
States = Annotated[list[str], Query(alias="state")]
Decisions = Annotated[list[str], Query(alias="decision")]
PageNumber = Annotated[int, Query(alias="page", ge=1)]
PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)]


def view_of(
    session: Any,
    user: Any,
    dag_id: str,
    start: str | None,
    end: str | None,
    state: list[str],
    decision: list[str],
    page_number: int,
    page_size: int,
    mlflow_conn_id: str = "mlflow_default",
) -> RetrainingView:
    """Read ``dag_id``'s runs and MLflow's aliases, and build the view; a bad filter is a 400."""
    try:
        filters = Filters.parse(start, end, state, decision)
        runs = sources.read_runs(session, dag_id)
        models = {
            str(task.result["model_name"])
            for run in runs
            for task in run.tasks
            if task_kind(task.result) == "register"
        }
        deadline = READS.deadline()  # MLflow's share of the page, whatever it answers
        registry = sources.read_registry(models, mlflow_conn_id, deadline)
        progress = sources.read_progress(dag_id, runs, mlflow_conn_id, deadline)
        registry = dataclasses.replace(registry, progress=progress) if progress else registry
        scorings = sources.read_scorings(session, readable_dag_ids(user)) if models else []
        return build_view(dag_id, runs, filters, page_number, page_size, registry, scorings)
    except FilterError as e:
        raise HTTPException(status_code=400, detail=str(e)) from e


def readable_dag_ids(user: Any) -> set[str]:
    """The DAGs ``user`` may read: a scoring in any other DAG stays out of the page."""
    from airflow.api_fastapi.app import get_auth_manager

    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


def create_app() -> FastAPI:
    """The app the plugin mounts at :data:`~emr_ray.views.registration.URL_PREFIX`."""
    app = FastAPI(title="emr_ray: Retraining view", docs_url=None, redoc_url=None, openapi_url=None)
    READS.warm_up()  # the first page should not wait for MLflow's import

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.get("/dags/{dag_id}", response_class=HTMLResponse, dependencies=READ_DAG)
    def dag_page(
        dag_id: str,
        session: SessionDep,
        user: GetUserDep,
        start: From = None,
        end: To = None,
        state: States = [],  # noqa: B006
        decision: Decisions = [],  # noqa: B006
        page_number: PageNumber = 1,
        page_size: PageSize = PAGE_SIZE,
    ) -> HTMLResponse:
        view = view_of(session, user, dag_id, start, end, state, decision, page_number, page_size)
        return HTMLResponse(page.render(view))

    @app.get("/api/dags/{dag_id}", dependencies=READ_DAG)
    def dag_rows(
        dag_id: str,
        session: SessionDep,
        user: GetUserDep,
        start: From = None,
        end: To = None,
        state: States = [],  # noqa: B006
        decision: Decisions = [],  # noqa: B006
        page_number: PageNumber = 1,
        page_size: PageSize = PAGE_SIZE,
    ) -> dict[str, Any]:
        view = view_of(session, user, dag_id, start, end, state, decision, page_number, page_size)
        rows = dataclasses.asdict(view)
        rows.pop("chronological")  # every filtered row is the plots' business: the JSON is one page
        return jsonable_encoder(rows)

    @app.get("/", response_class=HTMLResponse)
    def index(user: GetUserDep, session: SessionDep) -> HTMLResponse:
        readable = readable_dag_ids(user)
        return HTMLResponse(page.index_html(sources.retraining_dag_ids(session, readable), DAG_VIEW_URL))

    return app
