"""The study's tables from a store's results, and their renderings.

`tables` reduces a results tree (`storage.query.open_results`) to counts, then rates with 95%
intervals, section by section, and renders them as Markdown, CSV or JSON; one module per extra
table (`controls`, `nulls`, `readings`, `seeds`, `training`, `precision`, `intervals`);
`findings` states what the tables' intervals support; `html` and `plots` render the page and the
figures. A new table is a module here and a field on `tables.Report`. `precision_flips`
(`sweep precision`) measures what `precision` bounds: the one reader that runs models.
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "tables": ["Report", "build_report", "render_markdown", "render_csv", "render_json"],
    "html": ["render_html"],
    "plots": ["report_figures"],
})
