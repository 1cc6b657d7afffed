"""A second local Ray node joins the session's head (``ray start --address``), and a job submitted
through the Jobs API runs work on both nodes, as on a multi-node EMR cluster.

The node stays for the rest of the session, so later tests (the pipeline) also run on two nodes.
"""

from __future__ import annotations

import time

import pytest

from devstack.ray_head import add_worker_node
from emr_ray.hooks.ray import RayHook
from emr_ray.operators.ray import RayJobOperator
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration


@pytest.fixture
def two_nodes(ray_cluster, ray_conn):
    hook = RayHook(ray_conn)
    if len(hook.get_cluster_resources()["nodes"]) < 2:
        add_worker_node(ray_cluster, num_cpus=1)
        deadline = time.monotonic() + 60
        while len(hook.get_cluster_resources()["nodes"]) < 2:
            assert time.monotonic() < deadline, "the second node never joined"
            time.sleep(1)
    return hook.get_cluster_resources()


def test_the_cluster_reports_both_nodes(two_nodes):
    assert len(two_nodes["nodes"]) == 2
    assert two_nodes["total"]["CPU"] == 3


def test_a_job_places_work_on_both_nodes(two_nodes, ray_conn):
    op = RayJobOperator(task_id="spread", spec={"spread_tasks": 3}, poll_interval=0.5)
    result = op.execute({"ti": FakeTaskInstance("spread")})
    assert set(result["task_nodes"]) == {node["node_id"] for node in two_nodes["nodes"]}
