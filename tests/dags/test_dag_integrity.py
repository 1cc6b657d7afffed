"""Every DAG file parses without errors, with tags and retries, and without importing heavy libraries."""

from __future__ import annotations

import json
from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"
HEAVY = ("ray", "torch", "pyspark", "raydp", "mlflow")


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "retrain_tabular" in dagbag.dags


def test_every_dag_has_tags_and_every_task_retries(dagbag):
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"


def test_retrain_tabular_is_the_article_pipeline(dagbag):
    dag = dagbag.dags["retrain_tabular"]
    order = ["wait_for_partition", "check_cluster", "preprocess", "unless_dry_run", "train", "register"]
    assert [t.task_id for t in dag.topological_sort()] == order
    kinds = {t.task_id: type(t).__name__ for t in dag.tasks if t.task_id != "unless_dry_run"}
    assert kinds == {"wait_for_partition": "COSSensor", "check_cluster": "RayConnectOperator",
                     "preprocess": "RayDPSparkOperator", "train": "TorchTrainOperator",
                     "register": "MLflowRegisterOperator"}  # fmt: skip


def test_parsing_imports_no_heavy_library(fresh_python):
    """Each DAG file, parsed in turn in one fresh interpreter (``fresh_python``): the heavy modules that
    appear while it parses are its own. Pass or fail is as with one interpreter per file, at the cost
    of one; a heavy module two files load is named for the first of them only."""
    files = sorted(str(p) for p in DAGS.glob("*.py"))
    code = f"""
import importlib.util, json, sys
heavy, seen, found = set({HEAVY!r}), set(), {{}}
for path in {files!r}:
    spec = importlib.util.spec_from_file_location("d", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    now = {{m.split('.')[0] for m in sys.modules}} & heavy
    found[path.rsplit('/', 1)[1]] = sorted(now - seen)
    seen |= now
print(json.dumps(found))
"""
    out = fresh_python.run(code)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(found) == sorted(p.name for p in DAGS.glob("*.py"))
    assert {name: heavy for name, heavy in found.items() if heavy} == {}


def test_retraining_warns_when_a_run_misses_its_deadline(dagbag):
    """Airflow 3's DeadlineAlert (SLAs' successor): a late run is reported by the triggerer, not failed."""
    from emr_ray.deadlines import MISSED_DEADLINE_CALLBACK

    (alert,) = dagbag.dags["retrain_tabular"].deadline
    assert alert.callback.path == MISSED_DEADLINE_CALLBACK
    assert alert.interval.total_seconds() >= 3600


def test_the_deadline_warning_names_the_run_and_the_partition():
    import asyncio

    from emr_ray.deadlines import warn_missed_deadline

    context = {
        "dag_run": {"dag_id": "retrain_tabular", "dag_run_id": "scheduled__2026-11-02", "state": "running",
                    "logical_date": "2026-11-02T00:00:00Z", "conf": {}, "queued_at": "2026-11-03T00:00:05Z"},
        "deadline": {"id": "d1", "deadline_time": "2026-11-03T03:00:05Z"},
    }  # fmt: skip
    message = asyncio.run(warn_missed_deadline(context=context))
    assert "scheduled__2026-11-02" in message and "partition 2026-11-02" in message
    assert "2026-11-03T03:00:05Z" in message and "running" in message
