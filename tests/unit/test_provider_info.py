"""The provider info lists everything the package defines, so `airflow providers ...` shows all of it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import emr_ray
from emr_ray.provider_info import get_provider_info

KINDS = {  # provider-info section: the Airflow base class its modules define subclasses of
    "hooks": "airflow.sdk.BaseHook",
    "operators": "airflow.sdk.BaseOperator",
    "sensors": "airflow.sdk.BaseSensorOperator",
    "triggers": "airflow.triggers.base.BaseTrigger",
}


def _base(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _classes_defined_in(package: str, base: type) -> dict[str, list[str]]:
    """``{module: [class names]}`` of the ``base`` subclasses each module of ``package`` defines."""
    found: dict[str, list[str]] = {}
    path = importlib.import_module(package).__path__
    for info in pkgutil.iter_modules(path, prefix=f"{package}."):
        module = importlib.import_module(info.name)
        names = [
            name
            for name, obj in vars(module).items()
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and issubclass(obj, base)
        ]
        if names:
            found[info.name] = names
    return found


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_module_that_defines_one_is_listed(kind):
    listed = {m for entry in get_provider_info()[kind] for m in entry["python-modules"]}
    defined = _classes_defined_in(f"emr_ray.{kind}", _base(KINDS[kind]))
    assert sorted(set(defined) - listed) == [], f"add these modules to get_provider_info()['{kind}']"
    assert sorted(listed - set(defined)) == [], (
        f"get_provider_info()['{kind}'] lists modules that define none"
    )


def test_every_extra_link_is_listed_and_importable():
    from airflow.sdk import BaseOperatorLink

    classes = {
        f"{module}.{name}": getattr(importlib.import_module(module), name)
        for module, names in _classes_defined_in("emr_ray.links", BaseOperatorLink).items()
        for name in names
    }
    bases = {base for cls in classes.values() for base in cls.__mro__[1:]}
    concrete = sorted(path for path, cls in classes.items() if cls not in bases)  # shared bases are not links
    assert concrete == sorted(get_provider_info()["extra-links"])


def test_every_connection_type_names_a_hook_that_exists():
    for entry in get_provider_info()["connection-types"]:
        hook = _base(entry["hook-class-name"])
        assert hook.conn_type == entry["connection-type"]


def test_the_version_is_the_package_version():
    assert get_provider_info()["versions"] == [emr_ray.__version__]


def test_the_provider_info_is_valid_for_airflow_and_every_setting_has_a_default_of_its_type():
    import json
    from importlib.resources import files

    import jsonschema

    schema = json.loads(files("airflow").joinpath("provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    for section in info["config"].values():
        for option in section["options"].values():
            {"float": float, "integer": int, "string": str}[option["type"]](option["default"])
