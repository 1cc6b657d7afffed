"""What the plugin registers for the Retraining view (``emr_ray.views.registration``): a tab on every
DAG and a nav entry, both served by the mounted app, and a plugin file that stays cheap to import."""

from __future__ import annotations

import json
from pathlib import Path

from emr_ray.views.registration import DAG_TAB_ROUTE, EXTERNAL_VIEWS, FASTAPI_APP, URL_PREFIX, LazyApp


def test_the_tab_and_the_nav_entry_are_served_by_the_mounted_app():
    assert FASTAPI_APP["url_prefix"] == URL_PREFIX and isinstance(FASTAPI_APP["app"], LazyApp)
    by_destination = {view["destination"]: view for view in EXTERNAL_VIEWS}
    assert by_destination["dag"]["href"] == URL_PREFIX + "/dags/{DAG_ID}"  # the UI fills in {DAG_ID}
    assert by_destination["dag"]["url_route"] == DAG_TAB_ROUTE
    assert by_destination["nav"]["href"] == URL_PREFIX + "/"
    assert len({view["url_route"] for view in EXTERNAL_VIEWS}) == 2  # Airflow drops a repeated route


def test_importing_the_plugin_builds_no_app_and_imports_nothing_heavy(fresh_python):
    """Every Airflow process imports the plugin file; only the API server serves the view."""
    code = (
        "import json, sys; import emr_ray_plugin; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'ray', 'torch', 'pyspark', 'raydp', 'mlflow'} or m in {'emr_ray.views.app', 'fastapi'})))"
    )
    plugins = Path(__file__).resolve().parents[3] / "plugins"  # this checkout's, whatever is installed
    found = fresh_python.run(code, path=[str(plugins)])
    assert json.loads(found.stdout.strip().splitlines()[-1]) == []
