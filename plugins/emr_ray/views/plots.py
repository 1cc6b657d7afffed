"""The view's three plots as inline SVG, drawn in Python from the view model's rows (oldest first).

No plotting library and nothing fetched at run time: the page is one HTML document that renders in
the Airflow UI's frame as it is. Each plot is one ``<svg>`` string; a row without the figure a plot
needs leaves a gap there, and a plot with no figures at all says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from emr_ray.views.model import PROMOTED, PartitionRow

WIDTH, HEIGHT = 600, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 140, 24, 40  # margins: the legend sits on the right
#: one colour per stacked task, in the DAG's task order (repeats after the last)
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")


class Frame:
    """The plot area of one chart: x by row index, y from 0 (or the data's low end) to the top."""

    def __init__(self, count: int, low: float, high: float) -> None:
        self.count = max(count, 1)
        self.low, self.high = low, high if high > low else low + 1.0
        self.inner_w = WIDTH - LEFT - RIGHT
        self.inner_h = HEIGHT - TOP - BOTTOM

    def x(self, index: int) -> float:
        return LEFT + (index + 0.5) * self.inner_w / self.count

    def y(self, value: float) -> float:
        return TOP + self.inner_h * (1 - (value - self.low) / (self.high - self.low))

    @property
    def band(self) -> float:
        return self.inner_w / self.count


def _fmt(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _axes(frame: Frame, rows: Sequence[PartitionRow], unit: str) -> list[str]:
    parts = [
        f'<line x1="{LEFT}" y1="{TOP + frame.inner_h}" x2="{LEFT + frame.inner_w}" '
        f'y2="{TOP + frame.inner_h}" stroke="#888"/>'
    ]
    for fraction in (0.0, 0.5, 1.0):
        value = frame.low + fraction * (frame.high - frame.low)
        y = frame.y(value)
        parts.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + frame.inner_w}" y2="{y:.1f}" stroke="#eee"/>'
        )
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(value))}</text>')
    parts.append(f'<text x="4" y="12">{escape(unit)}</text>')
    step = max(1, -(-len(rows) // 5))  # at most 5 dates: they fit side by side
    for index in range(0, len(rows), step):
        label = rows[index].partition or "?"
        parts.append(
            f'<text x="{frame.x(index):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
    return parts


def _legend(entries: Sequence[tuple[str, str]]) -> list[str]:
    x = WIDTH - RIGHT + 12
    parts = []
    for i, (label, colour) in enumerate(entries):
        y = TOP + 14 * i
        parts.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{x + 14}" y="{y + 9}">{escape(label)}</text>')
    return parts


def _svg(title: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="10">'
        f"<title>{escape(title)}</title>{''.join(body)}</svg>"
    )


def _empty(title: str, why: str) -> str:
    return _svg(
        title,
        [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" fill="#666">{escape(why)}</text>'],
    )


def _polyline(
    frame: Frame,
    rows: Sequence[PartitionRow],
    value: Callable[[PartitionRow], float | None],
    colour: str,
    dashed: bool = False,
) -> list[str]:
    """Line segments through the rows that have a value (a missing one breaks the line), and a dot each."""
    parts: list[list[str]] = []
    run: list[str] = []
    for i, row in enumerate(rows):
        figure = value(row)
        if figure is None:
            if len(run) > 1:
                parts.append(run)
            run = []
            continue
        run.append(f"{frame.x(i):.1f},{frame.y(figure):.1f}")
    if len(run) > 1:
        parts.append(run)
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    out = [f'<polyline points="{" ".join(p)}" fill="none" stroke="{colour}"{dash}/>' for p in parts]
    for i, row in enumerate(rows):
        if (figure := value(row)) is not None:
            out.append(f'<circle cx="{frame.x(i):.1f}" cy="{frame.y(figure):.1f}" r="2.5" fill="{colour}"/>')
    return out


def metric_plot(rows: Sequence[PartitionRow]) -> str:
    """The gate's metric per partition-run, the new model's and the champion's, with a marker (and
    the version) wherever the champion changed."""
    metric = next((row.gate.metric for row in rows if row.gate.metric), None)
    title = f"{metric or 'gate metric'} per partition: new model and champion"
    values = [v for row in rows for v in (row.gate.challenger, row.gate.champion) if v is not None]
    if not values:
        return _empty(title, "no run recorded a gate metric")
    low, high = min(values), max(values)
    pad = (high - low) * 0.1 or abs(high) * 0.05 or 0.1
    frame = Frame(len(rows), low - pad, high + pad)
    body = _axes(frame, rows, metric or "")
    for i, row in enumerate(rows):
        if row.decision == PROMOTED:
            x = frame.x(i)
            body.append(
                f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + frame.inner_h}" '
                f'stroke="#e15759" stroke-dasharray="2 2"><title>champion: v{escape(str(row.version))} '
                f"({escape(row.partition or '?')})</title></line>"
            )
            body.append(
                f'<text x="{x + 2:.1f}" y="{TOP + 8}" fill="#e15759">v{escape(str(row.version))}</text>'
            )
    body += _polyline(frame, rows, lambda r: r.gate.champion, "#888", dashed=True)
    body += _polyline(frame, rows, lambda r: r.gate.challenger, "#4e79a7")
    body += _legend([("new model", "#4e79a7"), ("champion before", "#888"), ("champion changed", "#e15759")])
    return _svg(title, body)


def cost_plot(rows: Sequence[PartitionRow], task_order: Sequence[str]) -> str:
    """CPU-seconds reserved per partition-run, stacked by task (the DAG's task order)."""
    title = "CPU-seconds reserved per partition, by task"
    tasks = [t for t in task_order if any(t in row.cpu_by_task for row in rows)]
    tasks += sorted({t for row in rows for t in row.cpu_by_task} - set(tasks))
    totals = [sum(row.cpu_by_task.values()) for row in rows]
    if not tasks or not any(totals):
        return _empty(title, "no run recorded its usage")
    frame = Frame(len(rows), 0.0, max(totals) * 1.05)
    body = _axes(frame, rows, "CPU-s")
    width = max(frame.band * 0.7, 1.0)
    colours = {task: PALETTE[i % len(PALETTE)] for i, task in enumerate(tasks)}
    for i, row in enumerate(rows):
        base = 0.0
        for task in tasks:
            seconds = row.cpu_by_task.get(task)
            if not seconds:
                continue
            top = frame.y(base + seconds)
            body.append(
                f'<rect x="{frame.x(i) - width / 2:.1f}" y="{top:.1f}" width="{width:.1f}" '
                f'height="{frame.y(base) - top:.1f}" fill="{colours[task]}"><title>'
                f"{escape(row.partition or '?')} {escape(task)}: {seconds:.1f} CPU-s</title></rect>"
            )
            base += seconds
    body += _legend([(task, colours[task]) for task in tasks])
    return _svg(title, body)


def rows_plot(rows: Sequence[PartitionRow]) -> str:
    """Rows read (bars) and written (dots) per partition-run."""
    title = "rows per partition: read and written"
    values = [v for row in rows for v in (row.rows_in, row.rows_out) if v is not None]
    if not values:
        return _empty(title, "no run recorded its rows")
    frame = Frame(len(rows), 0.0, max(values) * 1.05)
    body = _axes(frame, rows, "rows")
    width = max(frame.band * 0.7, 1.0)
    for i, row in enumerate(rows):
        if row.rows_in is not None:
            top = frame.y(row.rows_in)
            body.append(
                f'<rect x="{frame.x(i) - width / 2:.1f}" y="{top:.1f}" width="{width:.1f}" '
                f'height="{frame.y(0) - top:.1f}" fill="#76b7b2"><title>{escape(row.partition or "?")}: '
                f"{row.rows_in:,} rows in</title></rect>"
            )
    body += _polyline(frame, rows, lambda r: None if r.rows_out is None else float(r.rows_out), "#f28e2b")
    body += _legend([("rows in", "#76b7b2"), ("rows out", "#f28e2b")])
    return _svg(title, body)
