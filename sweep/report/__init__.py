"""The study's tables from a store's results, and their renderings.

`tables` reduces a results tree (`storage.query.open_results`) to counts, then rates with 95%
intervals, section by section, and renders them as Markdown, CSV or JSON; one module per extra
table (`controls`, `nulls`, `readings`, `seeds`, `training`, `precision`, `intervals`);
`findings` states what the tables' intervals support; `html` and `plots` render the page and the
figures. A new table is a module here and a field on `tables.Report`. `precision_flips`
(`sweep precision`) measures what `precision` bounds: the one reader that runs models.
"""

from importlib import import_module

_EXPORTS = {
    "Report": "tables",
    "build_report": "tables",
    "render_markdown": "tables",
    "render_csv": "tables",
    "render_json": "tables",
    "render_html": "html",
    "report_figures": "plots",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
