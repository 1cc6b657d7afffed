"""The view's plots (``emr_ray.views.plots``): well-formed SVG with one mark per figure, champion
changes marked, and a plain message instead of an empty chart."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from devstack.retraining_runs import run, synthetic_runs
from emr_ray.views import plots
from emr_ray.views.model import build_view, partition_row

SVG = "{http://www.w3.org/2000/svg}"


def parsed(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # raises on anything that is not well-formed XML


def titles(root: ET.Element, tag: str) -> list[str]:
    return [el.findtext(f"{SVG}title") or "" for el in root.iter(f"{SVG}{tag}")]


def test_the_metric_plot_marks_each_champion_change_with_its_version():
    view = build_view("d", synthetic_runs(20), page_size=500)
    root = parsed(plots.metric_plot(view.chronological))
    promoted = [row for row in view.chronological if row.decision == "promoted"]
    marks = [t for t in titles(root, "line") if t.startswith("champion:")]
    assert marks == [f"champion: v{row.version} ({row.partition})" for row in promoted]
    assert len(list(root.iter(f"{SVG}circle"))) == 20 + 19  # every new model; a champion from the 2nd run on
    assert root.findtext(f"{SVG}title") == "test_accuracy per partition: new model and champion"


def test_the_cost_plot_stacks_each_tasks_cpu_seconds():
    view = build_view("d", synthetic_runs(3), page_size=500)
    root = parsed(plots.cost_plot(view.chronological, view.task_order))
    bars = titles(root, "rect")
    assert "2026-01-01 preprocess: 40.0 CPU-s" in bars and "2026-01-03 train: 60.0 CPU-s" in bars
    assert len([b for b in bars if "CPU-s" in b]) == 6


def test_the_rows_plot_has_a_bar_per_run():
    view = build_view("d", synthetic_runs(4), page_size=500)
    bars = [t for t in titles(parsed(plots.rows_plot(view.chronological)), "rect") if "rows in" in t]
    assert bars[0] == "2026-01-01: 20,000 rows in" and len(bars) == 4


def test_plots_without_figures_say_why():
    bare = [partition_row(run("2026-01-01", register=None, preprocess_cpu=None, train_cpu=None))]
    assert "no run recorded a gate metric" in plots.metric_plot(bare)
    assert "no run recorded its usage" in plots.cost_plot(bare, ["preprocess"])
    assert "no run recorded its rows" in plots.rows_plot([])
    for svg in (plots.metric_plot(bare), plots.cost_plot(bare, []), plots.rows_plot([])):
        parsed(svg)


def test_text_from_the_runs_is_escaped():
    rows = [partition_row(run("2026-01-01", run_id="<script>"))]
    svg = plots.rows_plot(rows)
    assert "<script>" not in svg
    parsed(svg)
