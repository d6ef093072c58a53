"""The HTML report in a real headless browser (Debian's chromium driven by its chromedriver through
selenium): it loads without console errors, fetches nothing, every figure decodes to a non-zero
size, long tables open on a click, and a screenshot is not blank. Skipped, with the reason, where
no browser is installed (`.ci/browser-up.sh` installs one)."""

from __future__ import annotations

import io
import shutil

import pytest

from storage.query import open_results
from sweep.report import html as report_html
from sweep.report.plots import CAPTIONS, report_figures
from sweep.report.tables import build_report
from tests.store_fixtures import hand_store

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no chromium/chromedriver on PATH: `bash .ci/browser-up.sh` installs them")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed "
                                    "(it is in the test extra: pip install -e '.[test]')")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1600", "--disable-extensions"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The hand store's page, with tables of more than 4 rows collapsed (the per-layer table)."""
    folder = tmp_path_factory.mktemp("browser")
    tree = open_results(hand_store(folder / "sweep.zarr"))
    report = build_report(tree, store="hand store")
    figures = {name: (figure, CAPTIONS[name])
               for name, figure in report_figures(tree, report).items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report_html, "LONG_TABLE", 4)
        text = report_html.render_html(report, figures)
    path = folder / "report.html"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_page_loads_without_console_errors_or_fetches(browser, page):
    browser.get(page.as_uri())
    assert browser.execute_script("return document.readyState") == "complete"
    assert browser.title == "Dobrushin bound tightness: hand store"
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert [url for url in fetched if not url.startswith("data:")] == []


def test_every_figure_decodes_with_a_non_zero_size(browser, page):
    browser.get(page.as_uri())
    sizes = browser.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, "
        "i.naturalHeight, i.getBoundingClientRect().width])")
    assert len(sizes) == 3
    for complete, width, height, shown in sizes:
        assert complete and width > 100 and height > 100 and shown > 100


def test_a_long_table_is_collapsed_until_its_summary_is_clicked(browser, page):
    browser.get(page.as_uri())
    details = browser.find_elements("css selector", "details")
    assert details, "the per-layer table (7 rows) should be collapsed at 4 rows"
    rows = details[0].find_elements("css selector", "tbody tr")
    assert not rows[0].is_displayed()
    details[0].find_element("css selector", "summary").click()
    assert rows[0].is_displayed()


def test_a_screenshot_is_not_blank(browser, page):
    from PIL import Image

    browser.get(page.as_uri())
    image = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("L")
    histogram = image.histogram()
    not_white = 1 - histogram[255] / sum(histogram)
    assert image.size[0] >= 1000 and not_white > 0.02, f"{100 * not_white:.2f}% non-white"
