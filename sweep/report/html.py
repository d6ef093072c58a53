"""The report as one self-contained HTML page: the Markdown report's sections, rendered, with the
figures inline.

The page is the Markdown report (`sweep.report.tables.render_markdown`: the same tables, computed
once) turned into HTML by `markdown_to_html`, which knows exactly the subset that renderer writes:
`#`/`##` headings, paragraphs, pipe tables and `code`. From the per-layer section on, tables
longer than `LONG_TABLE` rows sit in a `<details>` element, collapsed; the headline's tables
(rates, controls, nulls) stay open whatever their length. Figures are PNGs as base64 `data:`
URLs and the style sheet is inline: the page opens offline, and can be mailed as one file. No
script runs in it.
"""

from __future__ import annotations

import base64
import html
import io
import re

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
    """A `<figure>` holding `figure` as an inline PNG (base64), alt text and caption."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (f"<figure id=\"{html.escape(name)}\"><img alt=\"{html.escape(caption)}\" "
            f"src=\"data:image/png;base64,{data}\">"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def markdown_to_html(lines: list[str], collapse_from: str | None = None) -> str:
    """HTML of the Markdown subset the report writes: `# `/`## ` headings, paragraphs (blocks of
    text lines), pipe tables (a header row, a `|---|` row, body rows) and inline `code`. Long
    tables collapse; with `collapse_from`, only after the first heading that starts with it."""
    out: list[str] = []
    block: list[str] = []
    collapsing = collapse_from is None

    def flush() -> None:
        if not block:
            return
        if block[0].startswith("|"):
            out.append(_table_html(block, collapsible=collapsing))
        else:
            out.append(f"<p>{_inline(' '.join(block))}</p>")
        block.clear()

    for line in lines:
        heading = re.match(r"^(#{1,2}) (.*)$", line)
        if heading:
            flush()
            collapsing = collapsing or heading.group(2).startswith(collapse_from)
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif not line.strip():
            flush()
        elif block and block[0].startswith("|") != line.startswith("|"):
            flush()
            block.append(line)
        else:
            block.append(line)
    flush()
    return "\n".join(out)


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _table_html(rows: list[str], collapsible: bool = True) -> str:
    """A pipe table as `<table>`, inside a collapsed `<details>` when it is long and
    `collapsible`."""
    header, body = _cells(rows[0]), [_cells(r) for r in rows[2:]]
    head = "".join(f"<th>{_inline(c)}</th>" for c in header)
    cells = "\n".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>"
                      for row in body)
    table = (f"<div class=\"wrap\"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{cells}\n"
             "</tbody></table></div>")
    if len(body) <= LONG_TABLE or not collapsible:
        return table
    return (f"<details><summary>{len(body)} rows: {html.escape(', '.join(header[:3]))}, ... "
            f"(click to show)</summary>\n{table}\n</details>")


def _inline(text: str) -> str:
    """Escaped text with `code` spans as `<code>`."""
    parts = text.split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p)
                   for i, p in enumerate(parts))
