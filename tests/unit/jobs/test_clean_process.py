"""A call in a process of its own (``emr_ray.cluster.jobs.clean_process``): each call's child is forked
from one template process, answers, and is gone when the call returns; nothing of the parent's MLflow
login reaches it. Real processes, no cluster: the calls are standard-library functions, so the template
imports nothing ahead (``bench/clean_process.py`` measures it with torch and MLflow).
"""

from __future__ import annotations

import os
import sys
import time

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


def test_the_calls_exception_comes_back_as_data_and_only_as_a_type_the_caller_names():
    """What ran in the child may be hostile (a registered model is code): its exception crosses back
    as its type's name and message, rebuilt only as a class the caller names."""
    with pytest.raises(clean_process.CallFailed, match="^JSONDecodeError: Expecting"):
        clean_process.call("json:loads", {"s": "{"}, {})
    with pytest.raises(ValueError, match="^Expecting property name"):
        clean_process.call("json:loads", {"s": "{"}, {}, errors={"JSONDecodeError": ValueError})


def test_an_answer_that_is_not_data_is_refused_never_unpickled():
    """A crafted object (whose unpickling would run code here) cannot be an answer: JSON only."""
    with pytest.raises(clean_process.CallFailed, match="the answer is not JSON"):
        clean_process.call("pathlib:PurePosixPath", {}, {})  # a path object, not data


def test_nothing_the_child_started_outlives_the_call(tmp_path):
    """A call that starts a grandchild which hangs (a DataLoader worker, a crafted model's helper):
    the call returns when the child ends, and the grandchild is gone with it."""
    pidfile = tmp_path / "grandchild.pid"
    script = f"import subprocess; p = subprocess.Popen(['sleep', '300']); open({str(pidfile)!r}, 'w').write(str(p.pid))"
    assert (
        clean_process.call("subprocess:call", {"args": [sys.executable, "-c", script]}, {}, timeout_s=60) == 0
    )
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5  # killed by now; the kernel takes a moment to tear it down
    while os.path.exists(f"/proc/{grandchild}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{grandchild}"), open(f"/proc/{grandchild}/stat").read()


def test_the_template_holds_no_secret_looking_variable(monkeypatch):
    monkeypatch.setenv("EMR_RAY_COS_SECRET_KEY", "cos-key-the-child-must-not-see")
    clean_process._drop_template()
    assert clean_process.call("os:getenv", {"key": "EMR_RAY_COS_SECRET_KEY"}, {}) is None


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
