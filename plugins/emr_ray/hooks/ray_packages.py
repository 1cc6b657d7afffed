"""Ship the job's code to the cluster through the Jobs API's package upload, as Ray's own client does.

A remote cluster may have nothing of ours installed. With the ``ray`` connection's extra
``"code": "ship"`` (or the operator's ``code="ship"``), every job's runtime_env gets ``py_modules``
URIs for:

- the provider's cluster side (``emr_ray/__init__.py`` and ``emr_ray/cluster/``, exactly what
  :func:`emr_ray.cluster.reuse.code_version` hashes), so the cluster runs exactly the code this
  Airflow side was built with;
- the user's ``include/`` package (found next to the DAGs folder, or set with the connection's extra
  ``include_dir``; ``""`` ships none).

In both modes, local paths that the task's or the connection's runtime_env names in ``py_modules``
or as ``working_dir`` are zipped and uploaded too, as ``ray job submit`` does (the Jobs API cannot
read a path on the Airflow worker). URIs (``gcs://``, ``s3://``, ``https://``...) pass unchanged.

**Layout** as in ``ray/_private/runtime_env/packaging.py``: a ``py_modules`` directory is zipped
with its own folder at the top of the archive (the cluster puts the unpacked folder's parent on the
job's ``PYTHONPATH``), a ``working_dir`` with its contents at the top (it becomes the job's current
directory), a single ``.py`` module as that one file, a ``.whl`` as it is. The archives are
deterministic: entries sorted, timestamps fixed (1980-01-01), modes normalized (0644, or 0755 for
executables), no ``__pycache__``, ``*.pyc``, ``.git`` or virtualenvs, and the patterns of
``.gitignore`` / ``.rayignore`` files and of the runtime_env's ``excludes`` left out, as Ray does.
Never shipped, and logged: files that hold secrets (``.env``, keys, ``airflow.cfg``...:
:data:`SECRET_EXCLUDES`) and symlinks that lead out of the shipped folder.
So the same files give the same bytes, and the name ``gcs://_ray_pkg_<sha1 of the zip>.zip``
addresses the content: an unchanged package keeps its URI, and so the spec digest
(:mod:`emr_ray.cluster.reuse`) and reattach on retry.

**Upload** as ``JobSubmissionClient`` does, with the hook's HTTP client and token:
``GET /api/packages/gcs/<name>`` (200: the cluster has it; the call also pins it for the cluster's
temporary-reference expiry, 10 minutes by default), and on 404 ``PUT`` of the bytes. The cluster
deletes a package once no job uses it and no pin holds it, so a later job may upload it again.
Within a process the archive is built once per content: a stat walk (paths, sizes, mtimes) decides
whether a folder changed since it was zipped.

This module runs on the Airflow side: it never imports ``ray`` (only ``zipfile``, ``hashlib``,
``pathspec`` and the hook's ``httpx`` client).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import logging
import os
import stat
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emr_ray.cluster.reuse import cluster_side_files
from emr_ray.exceptions import RayConnectionConfigError, RayJobRejectedError

if TYPE_CHECKING:
    from emr_ray.hooks.ray import RayHook

log = logging.getLogger(__name__)

#: the connection extra / operator argument values
CODE_INSTALLED = "installed"
CODE_SHIP = "ship"
CODE_MODES = (CODE_INSTALLED, CODE_SHIP)
#: existing connections keep running on the code installed on the cluster (see the README)
DEFAULT_CODE = CODE_INSTALLED

PACKAGES = "/api/packages/gcs/"
PKG_PREFIX = "_ray_pkg_"
#: what never ships (gitignore patterns, as Ray's ``excludes``)
DEFAULT_EXCLUDES = ("__pycache__/", "*.pyc", "*.pyo", ".git/", ".venv/", "venv/", ".DS_Store")
#: files that hold secrets, never shipped (the Jobs API keeps packages readable to anyone with its
#: token); each one left out is logged with the way to ship what it holds instead
SECRET_EXCLUDES = (
    ".env",
    ".env.*",
    "*.env",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    "airflow.cfg",
    "unittests.cfg",
    "webserver_config.py",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keytab",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".ssh/",
    ".aws/",
    ".gnupg/",
    "credentials.json",
    "service-account*.json",
    "*.kubeconfig",
    "kubeconfig",
)
#: the fixed timestamp of every entry (the earliest a zip can hold)
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
#: Ray refuses packages of 512 MiB (its gRPC message limit) and more
MAX_PACKAGE_BYTES = 512 * 1024 * 1024
_UPLOAD_TIMEOUT = 300.0


@dataclass(frozen=True)
class Package:
    """One archive, ready to upload: its content-addressed URI, its bytes and what it holds."""

    uri: str
    data: bytes
    source: Path
    files: int
    build_seconds: float

    @property
    def name(self) -> str:
        """The package name in the Jobs API's ``/api/packages/gcs/<name>``."""
        return self.uri.removeprefix("gcs://")


def package_uri(data: bytes) -> str:
    """``gcs://_ray_pkg_<sha1 of the archive>.zip``: Ray's name for a package file's content."""
    return f"gcs://{PKG_PREFIX}{hashlib.sha1(data).hexdigest()}.zip"


# -- which files ----------------------------------------------------------------------------------
Matcher = Callable[[str], bool]


def _spec_matcher(patterns: Iterable[str]) -> Matcher | None:
    import pathspec

    lines = [p for p in patterns if p and p.strip() and not p.lstrip().startswith("#")]
    if not lines:
        return None
    spec = pathspec.PathSpec.from_lines("gitwildmatch", lines)
    return spec.match_file


def _ignore_file_matcher(directory: Path) -> list[tuple[Path, Matcher]]:
    """The ``.gitignore`` and ``.rayignore`` patterns of one folder, relative to it (as Ray reads them)."""
    found = []
    for name in (".gitignore", ".rayignore"):
        path = directory / name
        if path.is_file():
            matcher = _spec_matcher(path.read_text(errors="replace").splitlines())
            if matcher:
                found.append((directory, matcher))
    return found


def list_files(root: Path, excludes: Iterable[str] = ()) -> list[tuple[str, Path]]:
    """Every file under ``root`` that ships, as ``(posix path relative to root, path)``, sorted.

    Left out: :data:`DEFAULT_EXCLUDES`, ``excludes`` (gitignore patterns relative to ``root``) and the
    patterns of ``.gitignore`` / ``.rayignore`` files, each relative to its own folder; and, logged,
    files that hold secrets (:data:`SECRET_EXCLUDES`) and symlinks that lead out of ``root`` (an
    ``include/config -> /etc/airflow`` would ship ``airflow.cfg`` and its Fernet key).
    """
    root = root.absolute()
    real_root = os.path.realpath(root)
    base = _spec_matcher([*DEFAULT_EXCLUDES, *excludes])
    secret = _spec_matcher(SECRET_EXCLUDES)
    files: list[tuple[str, Path]] = []
    skipped: list[str] = []
    seen: set[str] = set()

    def excluded(path: Path, is_dir: bool, matchers: list[tuple[Path, Matcher]]) -> bool:
        for anchor, match in matchers:
            relative = path.relative_to(anchor).as_posix()
            if match(relative) or (is_dir and match(relative + "/")):
                return True
        return False

    def visit(directory: Path, matchers: list[tuple[Path, Matcher]]) -> None:
        real = os.path.realpath(directory)
        if real in seen:  # a symlink loop
            return
        seen.add(real)
        matchers = matchers + _ignore_file_matcher(directory)
        for child in sorted(directory.iterdir(), key=lambda p: p.name):
            is_dir = child.is_dir()
            if excluded(child, is_dir, matchers):
                continue
            relative = child.relative_to(root).as_posix()
            if secret and (secret(relative) or (is_dir and secret(relative + "/"))):
                skipped.append(f"{relative} (holds secrets)")
                continue
            target = os.path.realpath(child)
            if child.is_symlink() and os.path.commonpath([real_root, target]) != real_root:
                skipped.append(f"{relative} (a symlink to {target}, outside the folder)")
                continue
            if is_dir:
                visit(child, matchers)
            elif child.is_file():
                files.append((relative, child))

    visit(root, [(root, base)] if base else [])
    if skipped:
        log.warning(
            "Not shipping %d file(s) of %s: %s. Pass secrets through connections (the job gets them "
            "through the secret channel), and copy what a symlink points at into the folder if it "
            "must ship",
            len(skipped),
            root,
            "; ".join(skipped),
        )
    return sorted(files)


def _fingerprint(files: list[tuple[str, Path]]) -> tuple[tuple[str, int, int], ...]:
    result = []
    for relative, path in files:
        st = path.stat()
        result.append((relative, st.st_size, st.st_mtime_ns))
    return tuple(result)


def zip_bytes(entries: Iterable[tuple[str, Path]]) -> bytes:
    """A deterministic zip of ``(name in the archive, path)``: sorted, fixed time and modes, deflated."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for name, path in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.create_system = 3  # unix: the mode below is read on Linux nodes
            executable = os.stat(path).st_mode & stat.S_IXUSR
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
    return buffer.getvalue()


# -- building, cached per process ----------------------------------------------------------------
_cache: dict[tuple[Any, ...], tuple[tuple[Any, ...], Package]] = {}
_cache_lock = threading.Lock()


def build_package(path: str | os.PathLike, *, parent_dir: bool, excludes: Iterable[str] = ()) -> Package:
    """The archive of a folder (``parent_dir``: with the folder itself at the top, as ``py_modules``
    wants; else its contents, as ``working_dir`` wants) or of one ``.py`` file; a ``.whl`` is taken
    as it is, under its own name. Reused from this process's cache while no file changed.
    """
    source = Path(path).expanduser().absolute()
    excludes = tuple(excludes)
    started = time.perf_counter()
    if source.is_file():
        if source.suffix == ".whl":
            data = source.read_bytes()
            return Package(f"gcs://{source.name}", data, source, 1, time.perf_counter() - started)
        if source.suffix != ".py":
            raise ValueError(f"{source} is neither a folder, a .py module nor a .whl")
        files = [(source.name, source)]
    elif source.is_dir():
        files = list_files(source, excludes)
    else:
        raise FileNotFoundError(f"{source} does not exist")
    key = (str(source), parent_dir, excludes)
    fingerprint = _fingerprint(files)
    with _cache_lock:
        cached = _cache.get(key)
        if cached and cached[0] == fingerprint:
            return cached[1]
    prefix = f"{source.name}/" if parent_dir and source.is_dir() else ""
    data = zip_bytes((prefix + relative, file) for relative, file in files)
    if len(data) >= MAX_PACKAGE_BYTES:
        raise ValueError(
            f"the package of {source} is {len(data) / 2**20:.0f} MiB, above the cluster's limit of "
            f"{MAX_PACKAGE_BYTES // 2**20} MiB: leave large files out (.rayignore, or the runtime_env's "
            "excludes) or install that code on the cluster"
        )
    package = Package(package_uri(data), data, source, len(files), time.perf_counter() - started)
    with _cache_lock:
        _cache[key] = (fingerprint, package)
    return package


def provider_package() -> Package:
    """The cluster side of ``emr_ray`` (:func:`emr_ray.cluster.reuse.cluster_side_files`), under
    ``emr_ray/`` as ``py_modules`` wants: the same files the code version hashes."""
    files = cluster_side_files()
    source = Path(files[0][1]).parent
    key = (str(source), "cluster-side")
    fingerprint = _fingerprint(files)
    with _cache_lock:
        cached = _cache.get(key)
        if cached and cached[0] == fingerprint:
            return cached[1]
    started = time.perf_counter()
    data = zip_bytes((f"{source.name}/{name}", path) for name, path in files)
    package = Package(package_uri(data), data, source, len(files), time.perf_counter() - started)
    with _cache_lock:
        _cache[key] = (fingerprint, package)
    return package


def find_include_dir(setting: str | None = None, dags_folder: str | None = None) -> Path | None:
    """The user's ``include/`` package: ``setting`` when given (``""``: none), else ``include/`` next
    to or inside the DAGs folder, else wherever ``import include`` would find it here."""
    if setting is not None:
        if not str(setting).strip():
            return None
        path = Path(setting).expanduser()
        if not path.is_dir():
            raise RayConnectionConfigError(
                f"include_dir {setting!r} is not a folder on this Airflow worker: point the ray "
                "connection's extra include_dir at the project's include/ folder, or set it to \"\" "
                "to ship none"
            )
        return path.absolute()
    candidates = []
    if dags_folder:
        dags = Path(dags_folder).expanduser()
        candidates += [dags.parent / "include", dags / "include"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.absolute()
    spec = importlib.util.find_spec("include")
    if spec and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).absolute()
    return None


def _is_uri(value: str) -> bool:
    return "://" in value


def code_mode(value: Any, *, where: str) -> str:
    """``"installed"`` or ``"ship"`` (``None``: unset); anything else is refused with the fix."""
    text = str(value).strip().lower()
    if text not in CODE_MODES:
        raise RayConnectionConfigError(
            f'{where} code={value!r}: use "installed" (the cluster has emr_ray and include/ installed) '
            'or "ship" (upload them with every job through the Jobs API)'
        )
    return text


# -- upload ---------------------------------------------------------------------------------------
def ensure_uploaded(hook: RayHook, package: Package) -> bool:
    """Upload ``package`` unless the cluster has it (that check pins it there); True if uploaded."""
    path = PACKAGES + package.name
    if hook._request("GET", path, allow_404=True) is not None:
        return False
    hook._request("PUT", path, content=package.data, timeout=max(hook.timeout, _UPLOAD_TIMEOUT))
    return True


def _ship(hook: RayHook, package: Package, what: str) -> str:
    started = time.perf_counter()
    uploaded = ensure_uploaded(hook, package)
    hook.log.info(
        "Code package %s (%s: %d file(s), %.1f KiB, built in %.0f ms): %s in %.0f ms",
        package.uri,
        what,
        package.files,
        len(package.data) / 1024,
        package.build_seconds * 1000,
        "uploaded" if uploaded else "already on the cluster",
        (time.perf_counter() - started) * 1000,
    )
    return package.uri


def ship_packages(
    hook: RayHook,
    runtime_env: Mapping[str, Any],
    *,
    code: str | None = None,
    extra: Mapping[str, Any] | None = None,
    dags_folder: str | None = None,
) -> dict[str, Any]:
    """``runtime_env`` with its code shipped: local ``py_modules`` and ``working_dir`` paths (of the
    task's runtime_env or the connection's) replaced by uploaded package URIs, and with ``code`` (or
    the connection's extra ``code``) ``"ship"``, ``emr_ray`` and ``include/`` added to ``py_modules``.

    The result is merged over the connection's runtime_env at submit, as before; ``py_modules`` and
    ``working_dir`` are set in it whenever either side named them, so they win that merge.
    """
    from emr_ray.hooks.ray import merge_runtime_env

    if extra is None:
        extra = hook.get_connection(hook.ray_conn_id).extra_dejson
    if code is not None:
        mode = code_mode(code, where="operator argument")
    elif extra.get("code") is not None:
        mode = code_mode(extra["code"], where=f"ray connection {hook.ray_conn_id!r} extra")
    else:
        mode = DEFAULT_CODE
    merged = merge_runtime_env(hook.conn_config["runtime_env"], dict(runtime_env))
    shipped = dict(runtime_env)
    excludes = list(merged.get("excludes") or [])

    def local(value: Any, field: str, *, parent_dir: bool) -> str:
        text = str(value)
        if _is_uri(text):
            return text
        try:
            return _ship(hook, build_package(text, parent_dir=parent_dir, excludes=excludes), field)
        except (OSError, ValueError) as e:
            raise RayJobRejectedError(
                f"runtime_env {field} entry {text!r} is neither a URI nor a usable local path on this "
                f"Airflow worker ({e}); name a folder, a .py file or a .whl that exists here, or a URI "
                "the cluster can download (gcs://, s3://, https://)"
            ) from e

    modules = [local(m, "py_modules", parent_dir=True) for m in merged.get("py_modules") or []]
    if mode == CODE_SHIP:
        modules.append(_ship(hook, provider_package(), "emr_ray, cluster side"))
        if dags_folder is None:
            from airflow.sdk import conf

            dags_folder = conf.get("core", "dags_folder", fallback=None)
        include = find_include_dir(extra.get("include_dir"), dags_folder)
        if include is None:
            hook.log.info("No include/ folder found next to the DAGs folder %s: none shipped", dags_folder)
        else:
            modules.append(_ship(hook, build_package(include, parent_dir=True, excludes=excludes), "include"))
    if modules or "py_modules" in merged:
        shipped["py_modules"] = modules
    if merged.get("working_dir") is not None:
        shipped["working_dir"] = local(merged["working_dir"], "working_dir", parent_dir=False)
    return shipped
