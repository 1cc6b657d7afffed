"""The README stays true: its map names every module, and its connection example is accepted as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import emr_ray
from emr_ray.hooks.ray import RayHook

README = (Path(__file__).parents[2] / "README.md").read_text()


def test_the_map_names_every_module_of_the_provider():
    root = Path(emr_ray.__file__).parent
    modules = {p.name for p in root.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts}
    map_text = README.split("## How it is built", 1)[1].split("```", 2)[1]
    missing = sorted(name for name in modules if name not in map_text)
    assert missing == [], f"add these modules to the README map: {missing}"


def test_the_ray_connection_example_is_accepted_as_written(monkeypatch):
    example = re.search(r"AIRFLOW_CONN_RAY_DEFAULT='(\{.*?\})'", README)
    assert example, "the README lost its ray connection example"
    monkeypatch.setenv("AIRFLOW_CONN_RAY_README", example.group(1))
    config = RayHook("ray_readme").conn_config
    assert config["url"] == "https://10.0.3.15:8265" and config["token"] == "<token>"
    assert json.loads(example.group(1))["extra"]["code"] == "ship"
