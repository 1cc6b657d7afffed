"""The view model as one self-contained HTML page (inline CSS and SVG, no script), for the Airflow
UI's frame: the champion now and why, the filters, the three plots, the table and its pager.

Every missing figure is an em dash; every note a row carries is shown under it. Every link opens
in the frame (Airflow's frame sandbox allows neither popups nor navigating the page around it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from html import escape
from urllib.parse import urlencode

from emr_ray.views import plots
from emr_ray.views.model import DECISIONS, STATES, Filters, PartitionRow, RetrainingView, Serving

MISSING = "—"

STYLE = """
body{font-family:system-ui,sans-serif;font-size:13px;margin:12px;color:#222}
h1{font-size:18px;margin:0 0 8px} h2{font-size:14px;margin:16px 0 6px}
table{border-collapse:collapse;width:100%} th,td{border-bottom:1px solid #ddd;padding:4px 6px;
text-align:left;vertical-align:top} th{background:#f5f5f5;position:sticky;top:0}
td.n{text-align:right;font-variant-numeric:tabular-nums} .note{color:#a15c00;font-size:11px}
.serving{background:#f0f6ff;border:1px solid #c9dcf5;padding:8px;margin-bottom:8px}
.plots{display:flex;flex-wrap:wrap;gap:8px} .plots svg{border:1px solid #eee} form{margin:8px 0}
.promoted{color:#1a7f37;font-weight:600} .failed{color:#c62828} .pager a{margin:0 6px}
"""


def _text(value: object) -> str:
    return MISSING if value is None or value == "" else escape(str(value))


def _number(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return MISSING
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _metric(value: float | None) -> str:
    return MISSING if value is None else f"{value:.4f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"{value:.0f}s" if value < 120 else f"{value / 60:.1f}m"


def _link(url: str, label: str) -> str:
    """A link that opens in the frame: Airflow's frame allows no popups (``target="_blank"`` would do
    nothing) and no navigation of the page around it. Only ``http(s)`` links: a stored link is an
    XCom anyone with a task can write, and a ``javascript:`` one would run on Airflow's origin, so
    any other scheme shows as text."""
    if not safe_url(url):
        return f'{escape(label)} <span class="note">({escape(url)})</span>'
    return f'<a href="{escape(url)}" rel="noopener noreferrer">{escape(label)}</a>'


def safe_url(url: str) -> bool:
    """An ``http(s)`` address with a host (whatever its case and leading blanks), nothing else."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    return (
        parts.scheme.lower() in ("http", "https")
        and bool(parts.netloc)
        and not any(c in url for c in "\r\n\t")
    )


def serving_html(serving: Serving) -> str:
    if serving.model_name is None:
        return f'<div class="serving">{_text(serving.note)}</div>'
    version = f"v{escape(serving.version)}" if serving.version else MISSING
    if serving.url and serving.version:
        version = _link(serving.url, f"v{serving.version}")
    why = ""
    if serving.promoted_by:
        why = (
            f" since partition {_text(serving.partition)} (run <code>{escape(serving.promoted_by)}</code>): "
            f"{_text(serving.reason)}"
        )
    note = f'<div class="note">{escape(serving.note)}</div>' if serving.note else ""
    return (
        f'<div class="serving"><b>Serving now:</b> {escape(serving.model_name)} {version} '
        f"(champion, from {'MLflow' if serving.source == 'mlflow' else 'the runs'}){why}{note}</div>"
    )


def _options(name: str, values: Iterable[str], chosen: frozenset[str]) -> str:
    boxes = (
        f'<label><input type="checkbox" name="{name}" value="{escape(v)}"{" checked" if v in chosen else ""}>'
        f"{escape(v)}</label> "
        for v in values
    )
    return "".join(boxes)


def filters_html(filters: Filters) -> str:
    return (
        '<form method="get">'
        f'partition from <input type="date" name="from" value="{escape(filters.start or "")}"> '
        f'to <input type="date" name="to" value="{escape(filters.end or "")}"> '
        f"| state: {_options('state', STATES, filters.states)}"
        f"| decision: {_options('decision', DECISIONS, filters.decisions)}"
        '<button type="submit">Filter</button></form>'
    )


def query(filters: Filters, page: int, page_size: int) -> str:
    """The query string of this page's filters at ``page``."""
    pairs: list[tuple[str, str | int]] = []
    if filters.start:
        pairs.append(("from", filters.start))
    if filters.end:
        pairs.append(("to", filters.end))
    pairs += [("state", s) for s in sorted(filters.states)]
    pairs += [("decision", d) for d in sorted(filters.decisions)]
    pairs += [("page", page), ("page_size", page_size)]
    return urlencode(pairs)


def pager_html(view: RetrainingView) -> str:
    parts = [f"{view.total} partition-runs, page {view.page} of {view.pages}"]
    if view.page > 1:
        parts.append(f'<a href="?{escape(query(view.filters, view.page - 1, view.page_size))}">newer</a>')
    if view.page < view.pages:
        parts.append(f'<a href="?{escape(query(view.filters, view.page + 1, view.page_size))}">older</a>')
    return f'<div class="pager">{" ".join(parts)}</div>'


COLUMNS = (
    "partition",
    "run type",
    "state",
    "generation",
    "rows in / out",
    "model version",
    "gate: new / champion",
    "decision",
    "CPU-s / GPU-s",
    "wall time per task",
    "links",
)


def row_html(row: PartitionRow, task_order: Sequence[str]) -> str:
    gate = row.gate
    gate_cell = f"{_text(gate.metric)}<br>{_metric(gate.challenger)} / {_metric(gate.champion)}"
    if gate.champion_version:
        gate_cell += f" (v{escape(gate.champion_version)}{', same rows' if gate.same_rows else ''})"
    version = f"{_text(row.model_name)} v{escape(row.version)}" if row.version else MISSING
    if row.aliases:
        version += f'<div class="note">now: {escape(", ".join(row.aliases))}</div>'
    for scoring in row.scored:
        what = f"scored {_number(scoring.rows)} rows of {_text(scoring.partition)} ({escape(scoring.dag_id)})"
        if scoring.link is not None:
            what = _link(scoring.link.url, what)
        version += f'<div class="note">{what}</div>'
    decision = (
        f'<span class="{"promoted" if row.decision == "promoted" else ""}">{escape(row.decision)}</span>'
    )
    if row.reason:
        decision += f'<div class="note">{escape(row.reason)}</div>'
    walls = "<br>".join(
        f"{escape(task)} {_seconds(row.task_seconds[task])}"
        for task in task_order
        if task in row.task_seconds
    )
    links = " ".join(_link(link.url, link.label) for link in row.links) or MISSING
    notes = "".join(f'<div class="note">{escape(note)}</div>' for note in row.notes)
    started = row.run_after.strftime("%Y-%m-%d %H:%M") if isinstance(row.run_after, dt.datetime) else ""
    cells = [
        f'<b>{_text(row.partition)}</b><div class="note" title="{escape(row.run_id)}">{escape(started)}</div>{notes}',
        escape(row.run_type),
        f'<span class="{"failed" if row.state == "failed" else ""}">{_text(row.state)}</span>'
        + (f'<div class="note">{escape(row.progress)}</div>' if row.progress else ""),
        f"<code>{_text(row.generation)}</code>",
        f"{_number(row.rows_in)} / {_number(row.rows_out)}",
        version,
        gate_cell,
        decision,
        f"{_number(row.cpu_seconds)} / {_number(row.gpu_seconds)}",
        walls or MISSING,
        links,
    ]
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


#: a page with a run still going reloads itself, so a training's progress moves on screen
REFRESH = '<meta http-equiv="refresh" content="15">'


def render(view: RetrainingView) -> str:
    """The whole page of ``view``."""
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    body = "".join(row_html(row, view.task_order) for row in view.rows)
    if not view.rows:
        body = f'<tr><td colspan="{len(COLUMNS)}">no partition-run matches these filters</td></tr>'
    rows = view.chronological
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>Retraining: {escape(view.dag_id)}</title>'
        f"{REFRESH if any(row.state in ('running', 'queued') for row in view.rows) else ''}"
        f"<style>{STYLE}</style></head><body>"
        f"<h1>Retraining: {escape(view.dag_id)}</h1>"
        f"{serving_html(view.serving)}{filters_html(view.filters)}"
        f'<div class="plots">{plots.metric_plot(rows)}{plots.cost_plot(rows, view.task_order)}'
        f"{plots.rows_plot(rows)}</div>"
        f"{pager_html(view)}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        f"{pager_html(view)}</body></html>"
    )


def index_html(dag_ids: Sequence[str], page_url: str) -> str:
    """The nav page: the retraining DAGs this user may read, each linking to its view.

    :param page_url: a DAG's view, with ``{dag_id}`` in it (inside the same frame).
    """
    items = "".join(
        f'<li><a href="{escape(page_url.format(dag_id=d))}">{escape(d)}</a></li>' for d in dag_ids
    )
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>Retraining</title>'
        f"<style>{STYLE}</style></head><body><h1>Retraining DAGs</h1>"
        f"<ul>{items or '<li>no retraining DAG you may read</li>'}</ul></body></html>"
    )
