"""`sweep report STORE --html FILE`: one self-contained page with every section of the Markdown
report and the figures inline; long tables collapsed; nothing fetched from the network."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser

import matplotlib.image
import pytest

from storage.query import open_results
from sweep.cli.entry import main
from sweep.report.html import LONG_TABLE, markdown_to_html
from sweep.report.tables import build_report, render_markdown
from tests.store_fixtures import hand_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return hand_store(tmp_path_factory.mktemp("html") / "sweep.zarr")


class Page(HTMLParser):
    """The tags, attributes and text of an HTML page, and the tables' header and body cells."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.tables: list[dict] = []  # {"header": [...], "rows": [[...]], "in_details": bool}
        self._open: list[str] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._open.append(tag)
        if tag == "table":
            self.tables.append({"header": [], "rows": [], "in_details": "details" in self._open})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell).strip()
            table = self.tables[-1]
            (table["header"] if tag == "th" else table["rows"][-1]).append(text)
            self._cell = None
        while self._open and self._open.pop() != tag:
            pass

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def markdown_tables(markdown: str) -> list[list[list[str]]]:
    """The pipe tables of a Markdown text: per table, its header and body rows as cells."""
    tables, current = [], []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                current.append([c.strip().replace("`", "") for c in line.strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


@pytest.fixture(scope="module")
def page(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("page") / "report.html"
    assert main(["report", str(store), "--html", str(out), "--ci", "wilson"]) == 0
    return out.read_text(encoding="utf-8")


def test_the_page_holds_every_table_of_the_markdown_report_cell_for_cell(store, page):
    markdown = render_markdown(build_report(open_results(store), store=str(store)))
    html_tables = [[t["header"], *[r for r in t["rows"] if r]] for t in Page(page).tables]
    assert html_tables == markdown_tables(markdown)
    assert len(html_tables) >= 10


def test_the_page_is_self_contained(page):
    parsed = Page(page)
    tags = {tag for tag, _ in parsed.tags}
    assert "script" not in tags and "link" not in tags and "iframe" not in tags
    for tag, attrs in parsed.tags:
        for name in ("src", "href"):
            assert not re.match(r"^(https?:)?//", attrs.get(name) or ""), (tag, attrs)
    assert "http://" not in page and "https://" not in page


def test_every_figure_is_an_inline_png_that_decodes(page):
    images = [attrs for tag, attrs in Page(page).tags if tag == "img"]
    assert len(images) == 3  # depth, margins, baseline (the hand store has a baseline)
    for attrs in images:
        prefix = "data:image/png;base64,"
        assert attrs["src"].startswith(prefix) and attrs["alt"]
        pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(attrs["src"][len(prefix):])))
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels.std() > 0  # not one flat colour


def test_rates_are_named_with_their_reading(page):
    tables = Page(page).tables
    headline = tables[0]["header"]
    assert "all (A)" in headline and "content (A[C,C], renormalised)" in headline
    per_layer = next(t for t in tables if t["header"][:3] == ["model", "layer", "relative depth"])
    assert per_layer["header"][3] == "reading"
    assert {row[3] for row in per_layer["rows"] if row} == {
        "all (A)", "content (A[C,C], renormalised)"}


def test_long_tables_are_collapsed_and_short_ones_are_not():
    def table(rows: int) -> list[str]:
        return ["| a | b |", "|---|---|", *[f"| {i} | `x{i}` |" for i in range(rows)], ""]

    html = markdown_to_html(["# title", "", "some `code` text", *table(LONG_TABLE),
                             *table(LONG_TABLE + 1)])
    tables = Page(html).tables
    assert [t["in_details"] for t in tables] == [False, True]
    assert "<details>" in html and "<details open" not in html
    assert "<code>code</code>" in html and "<td><code>x3</code></td>" in html
    assert html.startswith("<h1>title</h1>\n<p>some <code>code</code> text</p>")


def test_the_headline_tables_stay_open_however_long():
    def table(rows: int) -> list[str]:
        return ["| a | b |", "|---|---|", *[f"| {i} | {i} |" for i in range(rows)], ""]

    long = table(LONG_TABLE + 5)
    html = markdown_to_html(["## 1. Headline", *long, "## Controls", *long, "## 2. Per layer",
                             *long, "## 3. Depth", *long], collapse_from="2.")
    assert [t["in_details"] for t in Page(html).tables] == [False, False, True, True]


def test_markup_in_names_is_escaped():
    html = markdown_to_html(["| model |", "|---|", "| <b>evil</b> & co |"])
    assert "&lt;b&gt;evil&lt;/b&gt; &amp; co" in html and "<b>" not in html


def test_html_alone_prints_nothing_on_stdout_and_names_the_file(store, tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "r.html"  # created, as --plots creates its folder
    assert main(["report", str(store), "--html", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and f"wrote {out}" in captured.err
    assert main(["report", str(store), "--html", str(out), "--format", "json"]) == 0
    assert capsys.readouterr().out.startswith("{")


def test_an_html_path_that_is_a_folder_is_one_line_exit_2(store, tmp_path, capsys):
    assert main(["report", str(store), "--html", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"sweep report: error: --html {tmp_path}: is a folder; give a file path " \
        "such as report.html"


@pytest.mark.s3
def test_a_store_on_s3_gives_the_same_page(store, tmp_path, s3_bucket, page):
    from tests.s3_fixtures import ENDPOINT, filesystem

    filesystem().put(str(store), f"{s3_bucket}/sweep.zarr", recursive=True)
    out = tmp_path / "remote.html"
    url = f"s3://{s3_bucket}/sweep.zarr"
    assert main(["report", url, "--storage-option", f"endpoint_url={ENDPOINT}",
                 "--html", str(out), "--ci", "wilson"]) == 0
    remote = out.read_text(encoding="utf-8")
    assert Page(remote).tables == Page(page).tables  # the title names the store: tables match
