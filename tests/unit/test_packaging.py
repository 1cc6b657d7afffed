"""The wheel ships only the provider (``emr_ray``), and its provider info is valid for Airflow.

The local stack (``devstack/``), the tests, the benchmarks and the scripts sit next to ``plugins/`` in
the repository, never inside the wheel. The wheel is built from a copy of the repository (the build
writes ``build/`` and ``*.egg-info`` next to the sources), offline and without build isolation.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: never copied: they are not sources, and they are large
SKIP = shutil.ignore_patterns(
    ".git", ".venv", ".state", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", "results"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """A wheel built from a copy of the repository."""
    tmp = tmp_path_factory.mktemp("packaging")
    source, out = tmp / "src", tmp / "dist"
    shutil.copytree(REPO, source, ignore=SKIP)
    assert (source / "devstack").is_dir(), "the copy must hold devstack/, or the checks below prove nothing"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
           "--disable-pip-version-check", "-q", "-w", str(out), str(source)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    (path,) = out.glob("emr_ray_provider-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def test_the_wheel_holds_only_the_provider(wheel: zipfile.ZipFile):
    wheel_names = wheel.namelist()
    packages = {name.split("/")[0] for name in wheel_names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"emr_ray"}
    sources = {
        p.relative_to(REPO / "plugins").as_posix() for p in (REPO / "plugins" / "emr_ray").rglob("*.py")
    }
    assert "emr_ray/hooks/ray.py" in sources
    assert sources <= set(wheel_names), sorted(sources - set(wheel_names))
    assert not [n for n in wheel_names if "devstack" in n or n.startswith("emr_ray/local/")]
    (entry_points,) = [n for n in wheel_names if n.endswith(".dist-info/entry_points.txt")]
    assert "provider_info = emr_ray.provider_info:get_provider_info" in wheel.read(entry_points).decode()


def test_provider_info_matches_airflows_schema():
    import jsonschema

    from emr_ray.provider_info import get_provider_info

    schema = json.loads(files("airflow").joinpath("provider_info.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(get_provider_info())


def test_the_tests_and_the_benchmarks_never_import_each_other():
    """What both need lives in ``devstack/`` (the live Airflow's client, fault injection, samples): a
    benchmark never depends on a test's helpers, and no test breaks when a benchmark changes."""
    import ast

    def imported(folder: str) -> dict[str, set[str]]:
        found = {}
        for path in (REPO / folder).rglob("*.py"):
            roots = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    roots.add(node.module.split(".")[0])
                elif isinstance(node, ast.Import):
                    roots |= {alias.name.split(".")[0] for alias in node.names}
            found[path.relative_to(REPO).as_posix()] = roots
        return found

    assert sorted(path for path, roots in imported("tests").items() if "bench" in roots) == []
    assert sorted(path for path, roots in imported("bench").items() if "tests" in roots) == []
