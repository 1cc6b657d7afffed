"""The data-path benchmark's verdicts and report: each design against issue 4's targets, as text.

Split from ``bench/data_path.py`` (which measures); this module only reads its results.
"""

from __future__ import annotations

from typing import Any

from bench._common import FEATURE_COLUMNS, per_second, table

PATHS = ("c", "b", "b_raydata", "a_on", "a_off")
LABELS = {
    "a_off": "(a) Spark toPandas, Arrow off (default) -> TensorDataset",
    "a_on": "(a) Spark toPandas, Arrow on -> TensorDataset",
    "b": "(b) per-worker shards: 2 actors shards.plan/read -> loop._tensors",
    "b_raydata": "Ray Data read_parquet.materialize -> iter_torch_batches (the feed before this change)",
    "c": "(c) read_table -> from_numpy, 1 process (upper bound)",
}
TARGETED = ("b", "b_raydata")  # the designs checked against issue 4's targets (b_raydata for reference)


def verdict(paths: dict[str, Any], which: str, key: str) -> dict[str, Any]:
    """Issue 4's targets for ``which`` on ``key`` (``cold`` or ``warm``), compared in rows/s.

    Rows/s rather than seconds, so that a path measured on a ``--subset`` of the files compares.
    """

    def speed(name: str) -> float | None:
        return paths.get(name, {}).get(f"{key}_rows_per_s")

    mine = speed(which)
    out: dict[str, Any] = {}
    if not mine:
        return out
    if speed("a_off"):
        out["speedup_vs_a_off"] = round(mine / speed("a_off"), 2)
        out["ge_5x_a_off"] = out["speedup_vs_a_off"] >= 5
    if speed("a_on"):
        out["speedup_vs_a_on"] = round(mine / speed("a_on"), 2)
        out["faster_than_a_on"] = out["speedup_vs_a_on"] > 1
    if speed("c"):
        out["slowdown_vs_c"] = round(speed("c") / mine, 2)
        out["within_2x_c"] = out["slowdown_vs_c"] <= 2
    out["meets_all"] = all(v for k, v in out.items() if k.startswith(("ge_", "faster_", "within_")))
    p = paths[which]
    paired = p.get(f"paired_c_{key}_median_s")  # (c) reads paired with this path's reads: same load
    if paired:
        out["slowdown_vs_c_same_load"] = round((p["paired_c_rows"] / paired) / mine, 2)
        out["meets_all_same_load"] = (
            out.get("ge_5x_a_off", False)
            and out.get("faster_than_a_on", False)
            and out["slowdown_vs_c_same_load"] <= 2
        )
    return out


def report(result: dict[str, Any]) -> str:
    rows, paths = result["rows"], result["paths"]
    lines = [
        f"data_path: {rows:,} rows x {len(FEATURE_COLUMNS)} float32 features + label, "
        f"{result['files']} Parquet files, batch size {result['batch_size']}, {result['workers']} workers; "
        f"ray.init {result.get('ray_init_s', '-')} s; load average at start "
        f"{result.get('machine', {}).get('loadavg_at_start', '-')}, at end {result.get('loadavg_at_end', '-')}",
        "",
    ]
    body = []
    for key in PATHS[::-1]:
        p = paths.get(key)
        if not p:
            continue
        warm = p["warm_median_s"]
        body.append(
            [
                LABELS[key],
                f"{p['rows']:,}" + (" (subset)" if p["rows"] != rows else ""),
                f"{p['cold_s']:.2f}",
                per_second(p["cold_rows_per_s"]),
                f"{warm:.2f}" if warm else "-",
                per_second(p["warm_rows_per_s"]),
                f"{p['cold_load1']} / {', '.join(str(v) for v in p['warm_load1'])}",
            ]
        )
    headers = ["path", "rows read", "cold s", "cold rows/s", "warm s (median)", "warm rows/s"]
    lines.append(table(headers + ["load1 cold / warm"], body))
    extra = []
    if "b" in paths:
        b = paths["b"]
        reads = "; ".join(", ".join(f"{t:.2f}" for t in r["worker_read_s"]) for r in b["runs"])
        footers = ", ".join(f"{r['footers_s']:.3f}" for r in b["runs"])
        starts = ", ".join(f"{t:.2f}" for t in b["actor_start_s"])
        colds = ", ".join(f"{t:.2f}" for t in b["cold_rounds_s"])
        extra.append(
            f"(b) actor start {starts} s (not counted); footers (in the time) {footers} s; "
            f"each worker's plan+read+_tensors per round (s): {reads}; rows per worker "
            f"{b['runs'][0]['rows_per_worker']}; cold = first read of fresh actors ({len(b['cold_rounds_s'])} "
            f"rounds, new actors each: {colds} s, median in the table), warm = the last round's actors again"
        )
    if "b_raydata" in paths:
        r = paths["b_raydata"]
        again = (
            f"; a second pass over the materialized data (epoch >= 2) {r['reiterate_median_s']:.2f} s = "
            f"{per_second(r['rows'] / r['reiterate_median_s'])} rows/s"
            if "reiterate_median_s" in r
            else ""
        )
        extra.append(
            f"(b_raydata) parts (warm median): materialize {r['materialize_median_s']:.2f} s, iterate "
            f"{r['iterate_median_s']:.2f} s{again}; actor start {r['actor_start_median_s']:.2f} s (not counted)"
        )
    if paths.get("b", {}).get("paired_c_cold_s"):
        b = paths["b"]
        extra.append(
            f"(b) (c) cold read of all {b['paired_c_rows']:,} rows paired with each cold b read (files dropped "
            f"from the page cache before each of the two; c first in even rounds): "
            f"{', '.join(f'{t:.2f}' for t in b['paired_c_cold_s'])} s, median {b['paired_c_cold_median_s']:.2f} s "
            f"= {per_second(b['paired_c_rows'] / b['paired_c_cold_median_s'])} rows/s"
        )
    for key in TARGETED:
        p = paths.get(key, {})
        if p.get("paired_c_warm_median_s"):
            extra.append(
                f"({key}) (c) read of all {p['paired_c_rows']:,} rows just before each warm {key} read "
                f"(same load): median {p['paired_c_warm_median_s']:.2f} s = "
                f"{per_second(p['paired_c_rows'] / p['paired_c_warm_median_s'])} rows/s"
            )
    for key in ("a_off", "a_on"):
        if key in paths:
            extra.append(
                f"{key}: raydp.init_spark {paths[key]['init_spark_s']:.1f} s, "
                f"stop_spark {paths[key]['stop_spark_s']:.1f} s (not counted)"
            )
    subsets = [k for k in PATHS if k in paths and paths[k]["rows"] != rows]
    if subsets:
        extra.append(
            f"{', '.join(subsets)} read a subset (--subset): the first files only; targets compare rows/s"
        )
    lines += [""] + [f"- {e}" for e in extra]
    lines += [
        "",
        "Issue 4 targets, in rows/s (b at least 5x a_off, faster than a_on, within 2x of c; "
        "b_raydata, the feed before this change, for reference):",
    ]
    body = []
    for which in TARGETED:
        for name in ("cold", "warm"):
            v = result["targets"].get(which, {}).get(name)
            if v:
                body.append(
                    [
                        f"{which} {name}",
                        f"{v['speedup_vs_a_off']}x" if "speedup_vs_a_off" in v else "-",
                        f"{v['speedup_vs_a_on']}x" if "speedup_vs_a_on" in v else "-",
                        f"{v['slowdown_vs_c']}x" if "slowdown_vs_c" in v else "-",
                        f"{v['slowdown_vs_c_same_load']}x" if "slowdown_vs_c_same_load" in v else "-",
                        "yes" if v["meets_all"] else "no",
                        {True: "yes", False: "no"}.get(v.get("meets_all_same_load"), "-"),
                    ]
                )
    headers = ["design", "vs a_off (>=5)", "vs a_on (>1)", "c vs it (<=2)", "c vs it, same load (<=2)"]
    lines.append(table(headers + ["meets all", "meets all (same-load c)"], body))
    return "\n".join(lines)
