"""The spec digest that decides whether a retry may reuse an earlier try's Ray job
(``emr_ray.operators.ray.spec_digest``): stable for the same inputs, different for any change in
what the job computes from, blind to secrets and to the force flag."""

from __future__ import annotations

from emr_ray.cluster.reuse import FORCE_ENV, code_version, digestible_runtime_env, spec_digest

PAYLOAD = {
    "partition": "2026-11-05",
    "config": {"epochs": 5, "lr": 0.003},
    "identity": {"airflow.task_id": "t"},
}
ENV = {"env_vars": {"PYTHONPATH": "/opt/project", "EMR_RAY_COS_SECRET_KEY": "s3cr3t"}}
CODE = "0.1.0+abc"


def digest(payload=PAYLOAD, env=ENV, module="emr_ray.cluster.jobs.train", code=CODE) -> str:
    return spec_digest(module, payload, env, code)


def test_the_same_inputs_give_the_same_digest_whatever_the_key_order():
    reordered = {
        "identity": {"airflow.task_id": "t"},
        "config": {"lr": 0.003, "epochs": 5},
        "partition": "2026-11-05",
    }
    assert digest() == digest(payload=reordered)
    assert len(digest()) == 64 and int(digest(), 16)


def test_any_change_in_what_the_job_computes_from_changes_the_digest():
    changed = {**PAYLOAD, "config": {"epochs": 6, "lr": 0.003}}
    assert digest(payload=changed) != digest()
    assert digest(payload={**PAYLOAD, "partition": "2026-11-06"}) != digest()
    assert digest(module="emr_ray.cluster.jobs.spark") != digest()
    assert digest(code="0.1.1+abc") != digest()
    assert digest(env={"env_vars": {**ENV["env_vars"], "PYTHONPATH": "/opt/other"}}) != digest()
    assert digest(env={**ENV, "working_dir": "gcs://_ray_pkg_1234.zip"}) != digest()


def test_secrets_and_the_force_flag_do_not_change_the_digest():
    rotated = {"env_vars": {**ENV["env_vars"], "EMR_RAY_COS_SECRET_KEY": "rotated", "MY_API_TOKEN": "t1"}}
    assert digest(env=rotated) == digest(env={"env_vars": {**ENV["env_vars"], "MY_API_TOKEN": "t2"}})
    assert digest(env={"env_vars": {**ENV["env_vars"], FORCE_ENV: "1"}}) == digest()
    shown = digestible_runtime_env(rotated)
    assert (
        shown["env_vars"]["EMR_RAY_COS_SECRET_KEY"] == "<secret>"
        and shown["env_vars"]["MY_API_TOKEN"] == "<secret>"
    )
    assert shown["env_vars"]["PYTHONPATH"] == "/opt/project"


def test_the_code_version_is_the_provider_version_and_a_hash_of_the_cluster_side_code():
    import emr_ray

    version = code_version()
    assert version.startswith(f"{emr_ray.__version__}+") and len(version.split("+")[1]) == 16
    assert code_version() == version  # computed once per process


def test_an_airflow_side_edit_leaves_the_code_version_and_so_the_digest_unchanged(tmp_path):
    """The one boundary between the sides (``emr_ray/cluster/`` and the package's ``__init__``):
    editing a Param's description or the provider's metadata keeps a retry reattaching to its own
    running job; editing cluster-side code does not."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import emr_ray

    copy = tmp_path / "emr_ray"
    shutil.copytree(Path(emr_ray.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))

    def version() -> str:
        probe = "from emr_ray.cluster.reuse import code_version; print(code_version())"
        env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    before = version()
    assert before == code_version()
    for airflow_side in ("params.py", "provider_info.py", "operators/ray.py", "hooks/ray_packages.py"):
        with (copy / airflow_side).open("a") as module:
            module.write("\n# an Airflow-side edit\n")
    assert version() == before
    with (copy / "cluster" / "spec.py").open("a") as module:
        module.write("\n# a cluster-side edit\n")
    assert version() != before


def test_external_inputs_reuse_only_on_evidence_that_the_job_read_the_same_thing():
    """What a job read from outside its spec (``external_changes``): each input that changed is named
    with its identity then and now; an input that could not be read, or a job that recorded none,
    never counts as unchanged."""
    from emr_ray.cluster.reuse import UNREADABLE, encode_external, external_changes

    raw = "the raw partition cos://b/raw/dt=2026-11-05"
    then = encode_external({raw: "2 files, 812 bytes, listing aaa"})
    assert external_changes(then, {raw: "2 files, 812 bytes, listing aaa"}) == []
    assert external_changes(then, {raw: "2 files, 500 bytes, listing bbb"}) == [
        f"{raw} changed since (then: 2 files, 812 bytes, listing aaa; now: 2 files, 500 bytes, listing bbb)"
    ]
    assert external_changes(None, {}) == [] and external_changes(encode_external({}), {}) == []
    assert external_changes(None, {raw: "x"}) == [
        f"its external inputs were not recorded ({raw} may have changed since)"
    ]
    assert external_changes("{not json", {raw: "x"})[0].startswith("its external inputs were not recorded")
    unreadable = {raw: f"{UNREADABLE}OSError"}
    assert "could not be compared" in external_changes(encode_external(unreadable), unreadable)[0]
    assert external_changes(then, {}) == [f"it read {raw}, which this try does not"]
    assert external_changes(encode_external({}), {raw: "x"}) == [
        f"it did not read {raw}, which this try does"
    ]
