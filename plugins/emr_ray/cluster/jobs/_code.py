"""Where a job's code came from, and what to do when the cluster lacks a package (cluster side).

:func:`code_origin` goes into the Spark and training jobs' results: the folders ``emr_ray`` and the
user's ``include`` were imported from (under the cluster's ``runtime_resources`` when the operator
shipped them, :mod:`emr_ray.hooks.ray_packages`). :func:`explain_import_error` turns a missing module
into a message that names it and the fix; the job runtime exits 2 with it (no retry installs it).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

#: the versions this provider is tested with, for the fix a missing-package message names
#: (tests/unit/jobs/test_code.py keeps them equal to requirements.txt)
TESTED_PINS = {
    "ray": "ray[default,train,data,rllib]==2.60.0",
    "raydp": "raydp==1.6.5",
    "pyspark": "pyspark==3.5.7",
    "mlflow": "mlflow==3.17.2",
    "torch": "torch==2.13.0",
    "pyarrow": "pyarrow==25.0.1",
    "qcloud_cos": "cos-python-sdk-v5==1.9.44",
}
#: import names whose pip distribution is named otherwise
PIP_NAMES = {"sklearn": "scikit-learn", "PIL": "pillow", "yaml": "pyyaml", "cv2": "opencv-python"}
#: this project's own packages: missing means the code was neither installed nor shipped
PROJECT_PACKAGES = frozenset({"emr_ray", "include"})


class MissingModuleError(ImportError):
    """A module the job needs is not installed on the cluster (exit 2: a retry cannot install it)."""


def missing_module(error: BaseException) -> str | None:
    """The top-level name of the module a ``ModuleNotFoundError`` in ``error``'s chain could not find."""
    seen: BaseException | None = error
    for _ in range(10):
        if seen is None:
            break
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            return seen.name.split(".")[0]
        seen = seen.__cause__ or seen.__context__
    return None


def explain_import_error(error: BaseException) -> BaseException:
    """``error`` itself, or, when a module is missing, a :class:`MissingModuleError` naming it and the fix."""
    module = missing_module(error)
    if module is None:
        return error
    if module in PROJECT_PACKAGES:
        message = (
            f"The Ray cluster cannot import {module!r}, this project's own code: set the ray connection's "
            'extra "code": "ship" (or the operator\'s code="ship") to upload emr_ray and include/ with '
            "every job, or install them on every node of the cluster."
        )
    else:
        pip = TESTED_PINS.get(module) or PIP_NAMES.get(module, module)
        message = (
            f"The Ray cluster lacks the Python package {module!r} that this job imports. Install it on "
            f"every node of the cluster (`pip install {pip}`), or add it to the job's runtime_env: "
            f'{{"pip": ["{pip}"]}}.'
        )
    if not isinstance(error, ModuleNotFoundError):
        message += f" ({error})"
    explained = MissingModuleError(message, name=module)
    explained.__cause__ = error
    return explained


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    locations = list(getattr(module, "__path__", None) or [])
    if not locations:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec else []
    return str(Path(locations[0]).resolve()) if locations else None


def code_origin() -> dict[str, str | None]:
    """The folders ``emr_ray`` and ``include`` are (or would be) imported from in this process."""
    return {name: _package_dir(name) for name in sorted(PROJECT_PACKAGES)}


#: the libraries a model version's receipt names (``emr_ray.receipt``), as installed where the job ran
LIBRARIES = ("ray", "pyspark", "raydp", "torch", "mlflow", "pyarrow")


def library_versions() -> dict[str, str]:
    """Python and the installed versions of :data:`LIBRARIES` (from their metadata: nothing imported)."""
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
