"""The Retraining view's page for a year of daily partitions: how long the view model and the page
(table and three inline SVG plots) take, on synthetic records (issue 34's target: under 1 s).

Records are built in memory (``devstack.retraining_runs.synthetic_runs``: the operators' XCom
shapes, a promotion whenever the new model beats the champion), so this measures the view alone,
not the metadata database: ``build`` (records -> view model: rows, filters, sort, paging, champion)
and ``render`` (view model -> HTML), for the default page (25 rows; the plots always cover every
filtered partition) and for every row on one page. Best and median of ``--repeat`` rounds. Prints a
table and writes ``bench/results/retraining_view-<time>.json``; no Ray, no Airflow database, a few
seconds: ``.venv/bin/python -m bench.retraining_view``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench._common import table, write_json
from devstack.retraining_runs import MODEL, synthetic_runs
from emr_ray.views import page
from emr_ray.views.model import build_view
from emr_ray.views.records import Registry

TARGET_SECONDS = 1.0


def timings(step: Callable[[], Any], repeat: int) -> list[float]:
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=365)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    info = {"cpus": os.cpu_count(), "python": platform.python_version(),
            "loadavg_at_start": [round(v, 2) for v in os.getloadavg()], "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
    runs = synthetic_runs(args.partitions)
    registry = Registry({MODEL: {"champion": "1"}})
    results: dict[str, Any] = {"machine": info, "args": vars(args), "target_seconds": TARGET_SECONDS}
    lines = []
    for case, size in (("default page (25 rows)", 25), (f"every row ({args.partitions})", args.partitions)):
        view = build_view("retrain_tabular", runs, page_size=size, registry=registry)
        html = page.render(view)
        build = timings(lambda size=size: build_view("retrain_tabular", runs, page_size=size, registry=registry),
                        args.repeat)  # fmt: skip
        render = timings(lambda view=view: page.render(view), args.repeat)
        whole = [b + r for b, r in zip(build, render, strict=True)]
        results[case] = {"build": build, "render": render, "whole": whole, "html_bytes": len(html)}
        lines.append([case, f"{min(build):.3f}", f"{min(render):.3f}", f"{min(whole):.3f}",
                      f"{statistics.median(whole):.3f}", f"{len(html) / 1e3:.0f} kB",
                      "yes" if statistics.median(whole) < TARGET_SECONDS else "NO"])  # fmt: skip
    headers = ["case", "build s (best)", "render s (best)", "page s (best)", "page s (median)", "HTML",
               f"under {TARGET_SECONDS:.0f} s"]  # fmt: skip
    print(f"{args.partitions} partitions, {args.repeat} rounds")
    print(table(headers, lines))
    results["loadavg_at_end"] = [round(v, 2) for v in os.getloadavg()]
    print(f"load average at start {info['loadavg_at_start']}, at end {results['loadavg_at_end']}")
    path = write_json(f"retraining_view-{time.strftime('%Y%m%d-%H%M%S')}.json", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
