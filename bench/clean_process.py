"""What a call in a process of its own costs (``emr_ray.cluster.jobs.clean_process``), before and after
the fork server, side by side in one run.

- ``before``: ``clean_process`` as of commit 5fcbb70, loaded from git: each call's child is a new
  Python process that imports torch and MLflow (started ahead, after the previous call);
- ``after``: today's: one template process imports them once; each call's child is forked from it.

Both run ``--calls`` calls of a trivial function (``os:getpid``: the call's own work is not what is
measured), alternating before/after call by call after one warm-up call each. Per call: the host's
CPU-seconds (every process, from ``/proc/stat``: a forked child is reaped by the kernel, so no
``getrusage`` sees it) and the call's wall-clock seconds, back to back (so ``before``'s call waits
for its child's imports; in a training they overlap the epochs, but still take the CPU). Run on a
quiet machine: other processes' CPU counts too. Writes ``bench/results/clean-process.json``.

    .venv/bin/python -m bench.clean_process --calls 10
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import REPO, machine, machine_busy_cpu_s, table, write_json

BEFORE_COMMIT = "5fcbb70"  # the last commit whose clean_process started a new child for each call
MODULE = "plugins/emr_ray/cluster/jobs/clean_process.py"


def load_before(folder: Path) -> Any:
    """The module as of :data:`BEFORE_COMMIT`, importable by its children as ``clean_process_before``."""
    source = subprocess.run(["git", "show", f"{BEFORE_COMMIT}:{MODULE}"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    (folder / "clean_process_before.py").write_text(source)
    sys.path.insert(0, str(folder))  # its children get this process's sys.path as PYTHONPATH
    return importlib.import_module("clean_process_before")


def one_call(module: Any) -> tuple[float, float]:
    """(host CPU-s, wall s) of one call."""
    cpu, began = machine_busy_cpu_s(), time.perf_counter()
    module.call("os:getpid", {}, {})
    return machine_busy_cpu_s() - cpu, time.perf_counter() - began


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    from emr_ray.cluster.jobs import clean_process as after

    result: dict[str, Any] = {"machine": machine(), "calls": args.calls, "before_commit": BEFORE_COMMIT}
    with tempfile.TemporaryDirectory() as tmp:
        before = load_before(Path(tmp))
        contenders = {"before": before, "after": after}
        for module in contenders.values():
            module.prepare()
            one_call(module)  # warm-up: the first child's (or the template's) imports
        measured: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
        for _ in range(args.calls):
            for name, module in contenders.items():
                measured[name].append(one_call(module))
    after._drop_template()
    for name, calls in measured.items():
        result[name] = {
            "cpu_s_per_call": round(statistics.median(c for c, _ in calls), 3),
            "wall_s_per_call": round(statistics.median(w for _, w in calls), 3),
            "calls": [[round(c, 3), round(w, 3)] for c, w in calls],
        }
    result["load1_end"] = round(os.getloadavg()[0], 2)
    rows = [
        [figure, result["before"][key], result["after"][key], f"{result['before'][key] / result['after'][key]:.0f}x"]
        for figure, key in (("host CPU-s per call (median)", "cpu_s_per_call"),
                            ("wall s per call, back to back (median)", "wall_s_per_call"))
    ]  # fmt: skip
    print(
        table(
            ["figure", "before: a child started per call", "after: forked from the template", "ratio"], rows
        )
    )
    print(f"load average at start {result['machine']['loadavg_at_start']}, at the end {result['load1_end']}")
    print(f"written {write_json('clean-process.json', result)}")


if __name__ == "__main__":
    main()
