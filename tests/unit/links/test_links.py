"""Extra links (``emr_ray.links``): each stores its whole URL under its own XCom key, and the URLs they build.

The round trip through Airflow's real XCom, where the task stores the link and Airflow reads it back
with ``get_link`` when the task ends, runs in real ``dag.test()`` DAG runs:
``tests/integration/test_mlflow_register.py`` (both MLflow links, with a UI URL and without one:
the empty link) and ``tests/integration/test_cos_sensor.py::test_dag_test_with_templated_key``
(the COS console link).
"""

from __future__ import annotations

from typing import Any

import pytest

from emr_ray.links.base import XComStoredLink
from emr_ray.links.cos import COSObjectLink
from emr_ray.links.mlflow import MLflowModelVersionLink, MLflowRunLink
from emr_ray.links.ray import RayJobLink

LINKS = [RayJobLink, MLflowRunLink, MLflowModelVersionLink, COSObjectLink]


class XComRecorder:
    """Stands in for a task instance: ``persist`` only calls ``ti.xcom_push``, and the unit layer has
    no Airflow database for a real one to push to. It records what was pushed."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, Any]] = []

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed.append((key, value))


@pytest.mark.parametrize("link", LINKS, ids=lambda link: link.__name__)
def test_persist_stores_the_url_under_the_links_own_key(link):
    assert issubclass(link, XComStoredLink) and link.name
    ti = XComRecorder()
    assert link.persist({"ti": ti}, "https://example/page") == "https://example/page"
    assert ti.pushed == [(f"_link_{link.__name__}", "https://example/page")]


@pytest.mark.parametrize("link", LINKS, ids=lambda link: link.__name__)
def test_a_missing_url_is_stored_as_an_empty_link(link):
    """Airflow reads every link back when the task ends and logs a missing one as an error."""
    ti = XComRecorder()
    assert link.persist({"ti": ti}, None) == ""
    assert ti.pushed == [(f"_link_{link.__name__}", "")]


@pytest.mark.parametrize("context", [{}, None])
def test_persist_outside_a_task_run_stores_nothing(context):
    assert RayJobLink.persist(context, "https://example/page") is None


def test_the_links_have_distinct_names_and_keys():
    links = [link() for link in LINKS]
    assert len({link.name for link in links}) == len({link.xcom_key for link in links}) == len(LINKS)


def test_the_plugin_registers_every_link():
    from emr_ray_plugin import EmrRayPlugin

    from emr_ray.provider_info import get_provider_info

    assert {type(link) for link in EmrRayPlugin.operator_extra_links} == set(LINKS)
    assert set(get_provider_info()["extra-links"]) == {f"{link.__module__}.{link.__name__}" for link in LINKS}


@pytest.mark.parametrize(
    ("bucket", "region", "prefix", "expected"),
    [
        (
            "data-1250000000",
            "ap-guangzhou",
            "raw/dt=2024-01-01/",
            "https://console.cloud.tencent.com/cos/bucket?bucket=data-1250000000&region=ap-guangzhou"
            "&path=raw/dt%3D2024-01-01/",
        ),
        (
            "b-1",
            "ap-beijing",
            "",
            "https://console.cloud.tencent.com/cos/bucket?bucket=b-1&region=ap-beijing&path=",
        ),
        (
            "b-1",
            "ap-beijing",
            "a b&c/",
            "https://console.cloud.tencent.com/cos/bucket?bucket=b-1&region=ap-beijing&path=a%20b%26c/",
        ),
    ],
)
def test_console_url(bucket, region, prefix, expected):
    assert COSObjectLink.url(bucket, region, prefix) == expected


@pytest.mark.parametrize(
    ("keys", "folder"),
    [
        (["raw/dt=1/_SUCCESS"], "raw/dt=1/"),
        (["raw/dt=1/part-0", "raw/dt=1/part-1"], "raw/dt=1/"),
        (["raw/dt=1/a", "raw/dt=2/a"], "raw/"),
        (["top"], ""),
        ([], ""),
    ],
)
def test_console_folder_of(keys, folder):
    assert COSObjectLink.folder_of(keys) == folder
