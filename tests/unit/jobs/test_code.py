"""A missing package becomes a message that names it and the fix; jobs report where their code came from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from emr_ray.cluster.jobs._code import TESTED_PINS, MissingModuleError, code_origin, explain_import_error
from emr_ray.cluster.spec import import_by_path

REPO = Path(__file__).resolve().parents[3]


def test_the_pins_a_message_names_are_the_ones_the_project_installs():
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-\[\],]+)==(\S+)", line.strip())
        if match:
            pins[match.group(1).split("[")[0].lower()] = line.strip()
    for spec in TESTED_PINS.values():
        name = spec.split("==")[0].split("[")[0].lower()
        assert pins.get(name) == spec, f"{spec} vs requirements.txt {pins.get(name)}"


def test_a_missing_cluster_dependency_names_the_package_and_the_pinned_install():
    try:
        import emr_ray_no_such_module  # noqa: F401
    except ImportError as e:
        e.name = "raydp"  # what a cluster without RayDP raises
        explained = explain_import_error(e)
    assert isinstance(explained, MissingModuleError) and explained.name == "raydp"
    message = str(explained)
    assert "lacks the Python package 'raydp'" in message
    assert "every node of the cluster (`pip install raydp==1.6.5`)" in message
    assert '{"pip": ["raydp==1.6.5"]}' in message


def test_a_missing_module_behind_a_user_import_path_is_named_with_the_path():
    with pytest.raises(ValueError) as raised:
        import_by_path("emr_ray_absent_pkg.sub:fn")
    message = str(explain_import_error(raised.value))
    assert message.startswith("The Ray cluster lacks the Python package 'emr_ray_absent_pkg'")
    assert "`pip install emr_ray_absent_pkg`" in message and "emr_ray_absent_pkg.sub:fn" in message


def test_missing_project_code_says_to_ship_it():
    error = ModuleNotFoundError("No module named 'include'", name="include.models.tabular")
    message = str(explain_import_error(error))
    assert "this project's own code" in message and '"code": "ship"' in message


def test_other_errors_pass_unchanged():
    error = ValueError("bad config")
    assert explain_import_error(error) is error
    broken = ImportError("cannot import name 'x' from 'y'")  # not a missing module: a broken one
    assert explain_import_error(broken) is broken


def test_code_origin_names_the_folders_the_packages_come_from():
    import emr_ray

    origin = code_origin()
    assert origin["emr_ray"] == str(Path(emr_ray.__file__).parent.resolve())
    assert origin["include"] == str((REPO / "include").resolve())
