"""A second local Ray node joins the session's head (``ray start --address``), and a job submitted
through the Jobs API runs work on both nodes, as on a multi-node EMR cluster.

The node stays for the rest of the session, so later tests (the pipeline) also run on two nodes. It
carries a ``second_node`` resource, so a test can pin a job's driver there.
"""

from __future__ import annotations

import time

import pytest

from devstack.ray_head import SECOND_NODE_PORTS, add_worker_node
from emr_ray.hooks.ray import RayHook
from emr_ray.operators.ray import RayJobOperator
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration


@pytest.fixture
def two_nodes(ray_cluster, ray_conn):
    hook = RayHook(ray_conn)
    if len(hook.get_cluster_resources()["nodes"]) < 2:
        add_worker_node(ray_cluster, num_cpus=1, resources='{"second_node": 1}')
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


def test_a_job_whose_driver_runs_on_the_second_node_has_its_result_read(two_nodes, ray_conn):
    """The Jobs API serves a job's logs from the agent of its driver's node; the result line is read
    there. (With both nodes on one address and default ports, the second node's agent had no HTTP
    port and every such job's logs answered 500 until the task's retry budget ran out.)"""
    op = RayJobOperator(
        task_id="on_second_node",
        spec={"payload": {"rows": 3}},
        entrypoint_resources={"second_node": 1},
        poll_interval=0.5,
    )
    result = op.execute({"ti": FakeTaskInstance("on_second_node")})
    assert result["echo"] == {"rows": 3}
    job = RayHook(ray_conn).get_job(op._submission_id)
    agent_port = SECOND_NODE_PORTS["dashboard-agent-listen-port"]
    assert job["driver_agent_http_address"] == f"http://127.0.0.1:{agent_port}"
