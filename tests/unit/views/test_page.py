"""The view's HTML (``emr_ray.views.page``): every column of a row, an em dash for what is missing,
the filters kept across pages, and nothing from a run's data rendered as markup."""

from __future__ import annotations

from html.parser import HTMLParser

from devstack.retraining_runs import MODEL, register_result, run, scoring, synthetic_runs
from emr_ray.views import page
from emr_ray.views.model import Filters, build_view
from emr_ray.views.records import Registry


class Cells(HTMLParser):
    """The text of each table cell, row by row, and every tag seen."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag == "td":
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data + " ")


def cells(html: str) -> Cells:
    parser = Cells()
    parser.feed(html)
    return parser


def test_a_row_shows_every_column():
    runs = [run("2026-11-28", register=register_result("3", True, 0.93, 0.91, "2"))]
    html = page.render(build_view("retrain_tabular", runs, registry=Registry({MODEL: {"champion": "3"}})))
    (row,) = [r for r in cells(html).rows if r]
    assert len(row) == len(page.COLUMNS)
    partition, run_type, state, generation, rows, version, gate, decision, cost, walls, links = row
    assert partition.startswith("2026-11-28") and (run_type, state) == ("scheduled", "success")
    assert (generation, rows, version) == ("g-2026-11-28-1", "20,000 / 20,000", f"{MODEL} v3 now: champion")
    assert gate == "test_accuracy 0.9300 / 0.9100 (v2)"
    assert decision == "promoted better than the champion" and cost == "100.0 / 0.0"
    assert "train 45s" in walls
    assert links == "Ray job (preprocess) Ray job (train) MLflow Run MLflow Model Version"
    assert "Serving now:" in html and f"{MODEL} v3" in html and "from MLflow" in html
    assert html.count("<svg") == 3


def test_a_version_cell_names_each_batch_scoring_with_it_linked_to_its_ray_job():
    runs = [run("2026-11-28", register=register_result("3", True, 0.93, 0.91, "2"))]
    html = page.render(build_view("retrain_tabular", runs, scorings=[scoring("3", "2026-11-28")]))
    (row,) = [r for r in cells(html).rows if r]
    assert row[5] == f"{MODEL} v3 scored 3,948 rows of 2026-11-28 (score_tabular)"
    assert 'href="http://ray:8265/#/jobs/asset_triggered__2026-11-28-v3-score"' in html


def test_what_is_missing_is_an_em_dash_and_a_note():
    runs = [run("2026-11-28", state="failed", register=None, train_cpu=None, preprocess_cpu=None)]
    (row,) = [r for r in cells(page.render(build_view("d", runs))).rows if r]
    assert row[5] == page.MISSING and row[6] == f"{page.MISSING} {page.MISSING} / {page.MISSING}"
    assert row[8] == f"{page.MISSING} / {page.MISSING}"
    assert "preprocess: no usage recorded" in row[0] and "no registration result" in row[0]


def test_the_pager_keeps_the_filters():
    view = build_view("d", synthetic_runs(60), Filters.parse("2026-01-01", None, ["success"], ["promoted"]),
                      page=1, page_size=5)  # fmt: skip
    html = page.render(view)
    assert f"{view.total} partition-runs, page 1 of {view.pages}" in html
    assert (
        'href="?from=2026-01-01&amp;state=success&amp;decision=promoted&amp;page=2&amp;page_size=5"' in html
    )
    assert 'name="decision" value="promoted" checked' in html


def test_nothing_from_a_run_becomes_markup():
    html = page.render(build_view("<b>d</b>", [run("2026-11-28", run_id="<img src=x>")]))
    assert "img" not in cells(html).tags and "<b>d</b>" not in html


def test_links_open_in_the_frame_which_allows_no_popups():
    html = page.render(
        build_view("d", [run("2026-11-28", register=register_result("3", True, 0.93, 0.91, "2"))])
    )
    assert 'href="http://mlflow/#/models/tabular-mlp/versions/3"' in html and "target=" not in html


def test_a_stored_link_that_is_not_http_renders_as_text():
    """An extra link is an XCom any task can write: ``javascript:`` would run on Airflow's origin."""
    for url in (
        "javascript:alert(document.cookie)",
        " JavaScript:alert(1)",
        "data:text/html,<b>x</b>",
        "//x",
    ):
        html = page._link(url, "Ray job (train)")
        assert "<a" not in html and "href" not in html and html.startswith("Ray job (train) ")
    good = "https://mlflow.example/#/models/m/versions/3"
    assert page._link(good, "v3") == f'<a href="{good}" rel="noopener noreferrer">v3</a>'
    assert not page.safe_url("https://x\n.example")


def test_the_nav_page_links_each_readable_dag_to_its_view_in_the_same_frame():
    html = page.index_html(["retrain_tabular"], "/emr-ray/retraining/dags/{dag_id}")
    assert '<a href="/emr-ray/retraining/dags/retrain_tabular">retrain_tabular</a>' in html
    assert "no retraining DAG you may read" in page.index_html([], "/x/{dag_id}")
