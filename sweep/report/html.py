"""The report as one self-contained HTML page: the Markdown report's sections, rendered, with the
figures inline.

The page is the Markdown report (`sweep.report.tables.render_markdown`: the same tables, computed
once) turned into HTML by `markdown_to_html` (markdown-it-py: headings, paragraphs, lists, pipe
tables and `code`, raw HTML escaped). From the per-layer section on, tables
longer than `LONG_TABLE` rows sit in a `<details>` element, collapsed; the headline's tables
(rates, controls, nulls) stay open whatever their length. Figures are PNGs as base64 `data:`
URLs and the style sheet is inline: the page opens offline, and can be mailed as one file. No
script runs in it.
"""

from __future__ import annotations

import base64
import html
import io

from markdown_it import MarkdownIt
from matplotlib.figure import Figure

from sweep.report.tables import Report, render_markdown

LONG_TABLE = 12  # tables with more body rows than this are collapsed
DETAILS_FROM = "2."  # heading that starts the detail sections (long tables collapse from here)

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1b1b1b;
       max-width: 1180px; margin: 2em auto; padding: 0 1.2em; }
h1 { font-size: 1.5em; border-bottom: 2px solid #ccc; padding-bottom: .3em; }
h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: 13px; }
th, td { border: 1px solid #d8d8d8; padding: .25em .55em; text-align: left;
         vertical-align: top; }
th { background: #f2f2f2; position: sticky; top: 0; }
tr:nth-child(even) td { background: #fafafa; }
td { font-variant-numeric: tabular-nums; }
code { background: #f2f2f2; padding: 0 .25em; border-radius: 3px; font-size: 90%; }
details { margin: .4em 0 1.2em; }
summary { cursor: pointer; color: #0b5cad; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 13px; color: #555; }
.wrap { overflow-x: auto; }
"""


def render_html(report: Report, figures: dict[str, tuple[Figure, str]] | None = None) -> str:
    """The page: the Markdown report's sections as HTML, and `figures` (name -> (figure,
    caption)) inline before the per-layer section."""
    body = markdown_to_html(render_markdown(report).splitlines(), collapse_from=DETAILS_FROM)
    if figures:
        gallery = ["<h2>Figures</h2>"] + [figure_html(figure, name, caption)
                                           for name, (figure, caption) in figures.items()]
        marker = f"<h2>{html.escape(DETAILS_FROM)}"
        at = body.find(marker)
        body = (body[:at] + "\n".join(gallery) + "\n" + body[at:] if at >= 0
                else body + "\n" + "\n".join(gallery))
    title = html.escape(f"Dobrushin bound tightness: {report.store}")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n"
            "</body>\n</html>\n")


def figure_html(figure: Figure, name: str, caption: str) -> str:
    """A `<figure>` holding `figure` as an inline PNG (base64), alt text and caption. Drawn
    once: the figures lay themselves out (constrained layout), so no `bbox_inches="tight"`
    (a second draw, a third of a figure's cost)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (f"<figure id=\"{html.escape(name)}\"><img alt=\"{html.escape(caption)}\" "
            f"src=\"data:image/png;base64,{data}\">"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def markdown_to_html(lines: list[str], collapse_from: str | None = None) -> str:
    """HTML of the Markdown report, by markdown-it-py (CommonMark with pipe tables; raw HTML in
    the text is escaped, never passed through). Long tables collapse into `<details>`; with
    `collapse_from`, only after the first heading that starts with it."""
    parser = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = parser.parse("\n".join(lines))
    collapsing = collapse_from is None
    out: list[str] = []
    start = 0
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.type == "heading_open" and collapse_from is not None:
            collapsing = collapsing or tokens[i + 1].content.startswith(collapse_from)
        if token.type == "table_open":
            end = next(j for j in range(i, len(tokens)) if tokens[j].type == "table_close")
            out.append(parser.renderer.render(tokens[start:i], parser.options, {}))
            table = parser.renderer.render(tokens[i:end + 1], parser.options, {})
            out.append(_wrapped(table, tokens[i:end + 1], collapsing))
            start = i = end + 1
            continue
        i += 1
    out.append(parser.renderer.render(tokens[start:], parser.options, {}))
    return "".join(out).rstrip("\n")


def _wrapped(table: str, tokens: list, collapsible: bool) -> str:
    """A rendered table in its scrolling wrapper, inside a collapsed `<details>` when it has more
    than LONG_TABLE body rows and is `collapsible`."""
    body = sum(t.type == "tr_open" for t in tokens) - 1  # the header's row
    header = [tokens[k + 1].content for k, t in enumerate(tokens) if t.type == "th_open"]
    wrapped = f"<div class=\"wrap\">{table.rstrip()}</div>\n"
    if body <= LONG_TABLE or not collapsible:
        return wrapped
    return (f"<details><summary>{body} rows: {html.escape(', '.join(header[:3]))}, ... "
            f"(click to show)</summary>\n{wrapped}</details>\n")
