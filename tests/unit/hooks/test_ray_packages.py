"""Code packages for the Jobs API upload: deterministic, content-addressed, without what never ships,
and laid out as Ray's own packaging lays them out and unpacks them. No server: the upload itself is
exercised against a real cluster in ``tests/integration/test_remote_cluster.py``."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from emr_ray.cluster.reuse import cluster_side_files
from emr_ray.exceptions import RayConnectionConfigError
from emr_ray.hooks import ray_packages
from emr_ray.hooks.ray_packages import (
    build_package,
    code_mode,
    find_include_dir,
    list_files,
    package_uri,
    provider_package,
)


def make_tree(root: Path) -> Path:
    files = {
        "mypkg/__init__.py": "",
        "mypkg/core.py": "VALUE = 1\n",
        "mypkg/sub/__init__.py": "",
        "mypkg/sub/data.json": "{}",
        "mypkg/__pycache__/core.cpython-311.pyc": "junk",
        "mypkg/stale.pyc": "junk",
        "mypkg/.git/HEAD": "ref",
        "mypkg/.venv/bin/python": "x",
        "mypkg/build/out.txt": "ignored by .gitignore",
        "mypkg/.gitignore": "build/\n*.log\n",
        "mypkg/run.log": "ignored",
        "mypkg/sub/.rayignore": "secret.txt\n",
        "mypkg/sub/secret.txt": "ignored by .rayignore",
        "mypkg/big/weights.bin": "excluded by the runtime_env",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "mypkg"


@pytest.fixture(autouse=True)
def _fresh_cache():
    ray_packages._cache.clear()
    yield
    ray_packages._cache.clear()


def names(data: bytes) -> list[str]:
    return zipfile.ZipFile(io.BytesIO(data)).namelist()


def test_only_sources_ship_not_caches_vcs_virtualenvs_or_ignored_files(tmp_path):
    pkg = make_tree(tmp_path)
    shipped = [relative for relative, _ in list_files(pkg, excludes=["big/"])]
    assert shipped == [".gitignore", "__init__.py", "core.py", "sub/.rayignore", "sub/__init__.py",
                       "sub/data.json"]  # fmt: skip


def test_secrets_and_symlinks_out_of_the_folder_never_ship_and_are_named_in_the_log(tmp_path, caplog):
    """Issue 32, item 6: a ``.env``, keys and an ``airflow.cfg`` reached through a symlink stayed in the
    package, readable to anyone with the Jobs API's token."""
    pkg = tmp_path / "include"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "mlp.py").write_text("X = 1\n")
    (pkg / ".env").write_text("MLFLOW_TRACKING_PASSWORD=hunter2\n")
    (pkg / "models" / "deploy.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    outside = tmp_path / "airflow-home"
    outside.mkdir()
    (outside / "airflow.cfg").write_text("fernet_key = abc\n")
    (pkg / "config").symlink_to(outside)
    (pkg / "alias.py").symlink_to(pkg / "models" / "mlp.py")  # inside the folder: ships
    caplog.set_level("WARNING")
    shipped = [relative for relative, _ in list_files(pkg)]
    assert shipped == ["__init__.py", "alias.py", "models/mlp.py"]
    assert "Not shipping 3 file(s)" in caplog.text
    assert ".env (holds secrets)" in caplog.text and "models/deploy.pem (holds secrets)" in caplog.text
    assert f"config (a symlink to {outside}, outside the folder)" in caplog.text
    assert "hunter2" not in caplog.text


def test_py_modules_layout_has_the_package_folder_on_top_and_working_dir_its_contents(tmp_path):
    pkg = make_tree(tmp_path)
    module = build_package(pkg, parent_dir=True, excludes=["big/"])
    assert names(module.data) == ["mypkg/.gitignore", "mypkg/__init__.py", "mypkg/core.py",
                                  "mypkg/sub/.rayignore", "mypkg/sub/__init__.py", "mypkg/sub/data.json"]  # fmt: skip
    working_dir = build_package(pkg, parent_dir=False, excludes=["big/"])
    assert names(working_dir.data)[:3] == [".gitignore", "__init__.py", "core.py"]
    assert module.uri != working_dir.uri


def test_the_archive_is_deterministic_and_its_name_is_its_content_hash(tmp_path):
    pkg = make_tree(tmp_path / "a")
    first = build_package(pkg, parent_dir=True)
    assert first.uri == package_uri(first.data)
    assert first.uri == f"gcs://_ray_pkg_{hashlib.sha1(first.data).hexdigest()}.zip"
    assert first.name == first.uri.removeprefix("gcs://")
    # the same files elsewhere, written later, with other mtimes and modes: the same bytes
    copy = make_tree(tmp_path / "b")
    os.utime(copy / "core.py", (1_000_000, 1_000_000))
    (copy / "core.py").chmod(0o600)
    again = build_package(copy, parent_dir=True)
    assert again.data == first.data and again.uri == first.uri
    infos = zipfile.ZipFile(io.BytesIO(first.data)).infolist()
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.external_attr >> 16 for i in infos} == {0o100644}


def test_a_changed_file_changes_the_uri_and_an_unchanged_folder_is_not_zipped_again(tmp_path):
    pkg = make_tree(tmp_path)
    first = build_package(pkg, parent_dir=True)
    assert build_package(pkg, parent_dir=True) is first  # the process cache: no second zip
    (pkg / "core.py").write_text("VALUE = 2\n")
    changed = build_package(pkg, parent_dir=True)
    assert changed.uri != first.uri
    (pkg / "core.py").write_text("VALUE = 1\n")
    assert build_package(pkg, parent_dir=True).uri == first.uri


def test_a_single_module_and_a_wheel(tmp_path):
    module = tmp_path / "helpers.py"
    module.write_text("X = 1\n")
    package = build_package(module, parent_dir=True)
    assert names(package.data) == ["helpers.py"]
    wheel = tmp_path / "mylib-1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK-not-really")
    assert build_package(wheel, parent_dir=True).uri == "gcs://mylib-1.0-py3-none-any.whl"
    with pytest.raises(FileNotFoundError):
        build_package(tmp_path / "missing", parent_dir=True)


def test_ray_unpacks_it_as_it_unpacks_its_own_package(tmp_path):
    """Ray's own ``create_package`` (what ``ray job submit`` uploads) and ours, unpacked by Ray's
    ``unzip_package`` (what a node does with a ``gcs://`` package): the same files, the same bytes."""
    from ray._private.runtime_env.packaging import create_package, unzip_package

    pkg = make_tree(tmp_path / "src")
    for parent_dir in (True, False):
        theirs_zip = tmp_path / f"theirs-{parent_dir}.zip"
        create_package(str(pkg), theirs_zip, include_gitignore=True, include_parent_dir=parent_dir,
                       excludes=["big/", "__pycache__", "*.pyc", ".git", ".venv"])  # fmt: skip
        ours_zip = tmp_path / f"ours-{parent_dir}.zip"
        ours_zip.write_bytes(build_package(pkg, parent_dir=parent_dir, excludes=["big/"]).data)
        trees = []
        for archive in (theirs_zip, ours_zip):
            target = tmp_path / f"unpacked-{archive.stem}"
            unzip_package(str(archive), str(target), remove_top_level_directory=False, unlink_zip=False)
            trees.append(
                {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}
            )
        assert trees[0] == trees[1]
        assert ("mypkg/core.py" in trees[1]) is parent_dir


def test_the_provider_package_is_the_cluster_side_and_imports_without_airflow(tmp_path):
    """What ships as ``emr_ray``: every cluster-side module, none of the Airflow side; unpacked alone
    on a path, its jobs import with Airflow made unimportable."""
    package = provider_package()
    shipped = names(package.data)
    assert "emr_ray/cluster/jobs/_runtime.py" in shipped and "emr_ray/cluster/jobs/spark.py" in shipped
    assert "emr_ray/cluster/train.py" in shipped and "emr_ray/cluster/spec.py" in shipped
    assert shipped == ["emr_ray/" + name for name, _ in cluster_side_files()]
    assert not [n for n in shipped if not (n == "emr_ray/__init__.py" or n.startswith("emr_ray/cluster/"))]
    assert not [n for n in shipped if "__pycache__" in n or n.endswith(".pyc")]
    target = tmp_path / "unpacked"
    zipfile.ZipFile(io.BytesIO(package.data)).extractall(target)
    probe = textwrap.dedent(
        f"""
        import importlib, importlib.abc, pkgutil, sys
        class NoAirflow(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] == "airflow":
                    raise ImportError("the cluster side imported " + name)
        sys.meta_path.insert(0, NoAirflow())
        sys.path.insert(0, {str(target)!r})
        import emr_ray, emr_ray.cluster.jobs
        assert emr_ray.__file__.startswith({str(target)!r}), emr_ray.__file__
        for m in pkgutil.iter_modules(emr_ray.cluster.jobs.__path__):
            importlib.import_module("emr_ray.cluster.jobs." + m.name)
        import emr_ray.cluster.train, emr_ray.cluster.partitions, emr_ray.cluster.storage, emr_ray.cluster.secrets
        print(sorted(n for n in sys.modules if n.split(".")[0] in ("airflow", "ray")))
        """
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "airflow" not in run.stdout


def test_packaging_never_imports_ray(fresh_python):
    probe = "import sys, emr_ray.hooks.ray_packages as p; p.provider_package(); print('ray' in sys.modules)"
    run = fresh_python.run(probe)
    assert run.stdout.strip() == "False"


def test_include_is_found_next_to_the_dags_folder_or_where_set(tmp_path):
    (tmp_path / "dags").mkdir()
    (tmp_path / "include").mkdir()
    assert find_include_dir(None, str(tmp_path / "dags")) == tmp_path / "include"
    assert find_include_dir("", str(tmp_path / "dags")) is None
    assert find_include_dir(str(tmp_path / "include"), None) == tmp_path / "include"
    with pytest.raises(RayConnectionConfigError, match="include_dir .* is not a folder"):
        find_include_dir(str(tmp_path / "nowhere"), None)


def test_the_code_setting_takes_installed_or_ship_only():
    assert code_mode("Ship", where="x") == "ship" and code_mode("installed", where="x") == "installed"
    with pytest.raises(RayConnectionConfigError, match=r"code='upload'.*\"installed\".*\"ship\""):
        code_mode("upload", where="operator argument")


def test_the_include_shipped_is_the_one_beside_the_runs_dag_file(tmp_path):
    """Ship mode takes ``include/`` from beside the DAG file the task was parsed from (the run's DAG
    bundle version), not from ``[core] dags_folder``: two Celery workers with other checkouts ship the
    run's code, not each their own."""
    from airflow.sdk import DAG

    from emr_ray.operators.ray import RayJobOperator

    bundle = tmp_path / "bundle-v2"
    (bundle / "dags").mkdir(parents=True)
    (bundle / "include").mkdir()
    dag_file = bundle / "dags" / "retrain.py"
    dag_file.write_text("# the DAG file of this bundle version\n")
    with DAG("retrain", schedule=None) as dag:
        op = RayJobOperator(task_id="t", spec={"payload": "x"})
    dag.fileloc = str(dag_file)
    assert op.dags_folder() == str(bundle / "dags")
    assert find_include_dir(None, op.dags_folder()) == bundle / "include"
    assert RayJobOperator(task_id="alone", spec={"payload": "x"}).dags_folder() is None
