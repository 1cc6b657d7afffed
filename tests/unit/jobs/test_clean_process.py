"""A call in a process of its own (``emr_ray.cluster.jobs.clean_process``): each call's child is forked
from one template process, answers, and is gone when the call returns; nothing of the parent's MLflow
login reaches it. Real processes, no cluster: the calls are standard-library functions, so the template
imports nothing ahead (``bench/clean_process.py`` measures it with torch and MLflow).
"""

from __future__ import annotations

import json
import os

import pytest

from emr_ray.cluster.jobs import clean_process
from emr_ray.cluster.mlflow_auth import PASSWORD


@pytest.fixture(scope="module", autouse=True)
def template_without_the_parents_login():
    """One template for the module, started with an MLflow password in the parent's environment (a
    test that kills it has the next call start another)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(PASSWORD, "s3cret-password")
        env.setattr(clean_process, "PREIMPORTS", ())
        clean_process._drop_template()
        clean_process.prepare()
        yield
        clean_process._drop_template()


def test_each_call_runs_in_a_child_of_one_template_that_is_gone_when_the_call_returns():
    clean_process.prepare()
    template = clean_process._template
    assert template is not None
    first = clean_process.call("os:getpid", {}, {})
    second = clean_process.call("os:getpid", {}, {})
    assert len({first, second, os.getpid(), template.process.pid}) == 4
    assert not os.path.exists(f"/proc/{first}") and not os.path.exists(f"/proc/{second}")
    assert clean_process._template is template and template.alive()  # forked from, not restarted


def test_a_call_gets_its_own_environment_and_never_the_parents_login():
    assert clean_process.call("os:getenv", {"key": PASSWORD}, {}) is None
    assert clean_process.call("os:getenv", {"key": "EMR_RAY_CALL"}, {"EMR_RAY_CALL": "1"}) == "1"
    # what one call set in its environment is gone with its process
    assert clean_process.call("os:getenv", {"key": "EMR_RAY_CALL"}, {}) is None


def test_the_calls_exception_is_raised_here():
    with pytest.raises(json.JSONDecodeError):
        clean_process.call("json:loads", {"s": "{"}, {})


def test_a_call_past_its_timeout_is_killed_and_fails_saying_so():
    with pytest.raises(
        clean_process.CallFailed, match="did not finish in 1s in its own process; it was killed"
    ):
        clean_process.call("subprocess:call", {"args": ["sleep", "5"]}, {}, timeout_s=1)
    assert clean_process.call("json:loads", {"s": "[1]"}, {}) == [1]  # the template serves the next


def test_a_dead_template_is_replaced_by_the_next_call():
    clean_process.prepare()
    dead = clean_process._template
    assert dead is not None
    dead.process.kill()
    dead.process.wait()
    assert clean_process.call("json:loads", {"s": "2"}, {}) == 2
    assert clean_process._template is not dead
