"""The report opens with at most ten findings, ranked; the full list still ends it."""

from __future__ import annotations

import pandas as pd

from sweep.report.findings import COLUMNS, HEADLINE_LIMIT, headline, headline_section


def finding(model, kind, estimate=0.1, token_set="all", text=None):
    return {"model": model, "token_set": token_set, "kind": kind, "estimate": estimate,
            "ci_low": estimate - 0.05, "ci_high": estimate + 0.05,
            "text": text or f"{model} ({token_set}) {kind} {estimate}", "ci_method": "wilson"}


FINDINGS = pd.DataFrame([
    finding("m", "vs_null:uniform", 0.30),
    finding("m", "vs_null:softmax-b4", 0.20),  # m's weakest null on all tokens
    finding("m", "vs_null:uniform", 0.40, "content"),
    finding("m", "failures_by_layer", text="m (all): failures by layer ...; they concentrate in "
                                           "layer 5"),
    finding("m", "failures_by_layer", token_set="content",
            text="m (content): failures by layer ...; no layer is singled out"),
    finding("m", "vs_control", 0.6),
    finding("m@random-init", "vs_null:uniform", 0.01),  # a control's own: not a headline
    finding("f@seed0", "vs_control", 0.05),  # one seed's replicate: its seeds' finding says more
    finding("f@seed0", "vs_null:uniform", 0.02),
    finding("f", "seeds_vs_control", 0.03),
    finding("f + g", "seeds_pooled_vs_control", 0.02),
], columns=COLUMNS)


def test_the_headline_ranks_kinds_and_keeps_the_weakest_null():
    top = headline(FINDINGS)
    assert list(zip(top["model"], top["kind"], top["token_set"], strict=True)) == [
        ("m", "vs_control", "all"),
        ("f + g", "seeds_pooled_vs_control", "all"),
        ("f", "seeds_vs_control", "all"),
        ("m", "vs_null:softmax-b4", "all"),
        ("m", "vs_null:uniform", "content"),
        ("m", "failures_by_layer", "all"),
    ]
    pd.testing.assert_frame_equal(top.reset_index(drop=True),
                                  FINDINGS.loc[top.index].reset_index(drop=True))


CONCENTRATED = "failures by layer ...; they concentrate in layer 0"
STUDY = pd.DataFrame([  # one seed, swept over its checkpoints (issue 45's small study)
    finding("lm", "vs_control", 0.6),
    finding("lm", "vs_null:uniform", 0.65),
    finding("lm", "failures_by_layer", text=f"lm (all): {CONCENTRATED}"),
    *(finding(f"vit@seed0@epoch{k}", kind, -0.1, text=f"vit@seed0@epoch{k} (all): "
              f"{CONCENTRATED if kind == 'failures_by_layer' else kind}")
      for k in (0, 5, 20) for kind in ("vs_null:uniform", "failures_by_layer")),
    finding("vit@seed0", "vs_null:uniform", -0.13),
    finding("vit@seed0", "failures_by_layer", text=f"vit@seed0 (all): {CONCENTRATED}"),
    finding("vit@seed0", "vs_control", -0.22),  # one seed: no across-seed finding replaces it
    finding("vit@seed0@random-init", "vs_null:uniform", 0.08),
    finding("vit", "over_training_vs_control", -0.2),
    finding("vit", "over_training_vs_nulls", -0.1),
], columns=COLUMNS)


def test_separations_from_controls_over_training_and_nulls_lead_failures_follow():
    top = headline(STUDY)
    assert list(zip(top["model"], top["kind"], strict=True)) == [
        ("lm", "vs_control"),
        ("vit@seed0", "vs_control"),  # a single seed's replicate keeps its own comparison
        ("vit", "over_training_vs_control"),
        ("vit", "over_training_vs_nulls"),
        ("lm", "vs_null:uniform"),
        ("lm", "failures_by_layer"),  # the checkpoints' and the trained ViT's: in the trajectory
    ]


def test_a_replicate_gives_way_to_its_seeds_only_where_they_have_a_finding():
    rows = pd.DataFrame([finding("f@seed0", "vs_control", 0.05, "all"),
                         finding("f@seed0", "vs_control", 0.05, "content"),
                         finding("f", "seeds_vs_control", 0.03, "all")], columns=COLUMNS)
    top = headline(rows)
    assert list(zip(top["model"], top["token_set"], strict=True)) == [
        ("f@seed0", "content"), ("f", "all")]


def test_at_most_ten_and_the_section_points_to_the_rest():
    many = pd.DataFrame([finding(f"m{i}", "vs_control") for i in range(15)], columns=COLUMNS)
    assert len(headline(many)) == HEADLINE_LIMIT == 10
    lines = headline_section(many)
    assert lines[0] == "## Headline findings"
    assert "The 10 findings to read first, of 15" in lines[2]
    assert sum(line.startswith("- ") for line in lines) == 10
    assert headline_section(FINDINGS.iloc[:0]) == []


def test_the_markdown_reads_headline_findings_then_layers_then_detail(tmp_path):
    from storage.query import open_results
    from sweep.report.tables import build_report, render_markdown
    from tests.store_fixtures import hand_store

    path = hand_store(tmp_path / "sweep.zarr")
    text = render_markdown(build_report(open_results(path), store=str(path)))
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    at = {h.split(":")[0]: i for i, h in enumerate(headings)}
    if "## Headline findings" in at:
        assert at["## Headline findings"] < at["## 1. Headline"]
    assert at["## 2. Per layer"] < at["## 3. Depth"] < at["## Detail"]
    assert text.index("Verdicts at the data's precision") > text.index("## 3. Depth")
    assert headings[-1] == "## Findings"


def test_the_html_page_lists_the_findings_one_item_each():
    from sweep.report.html import markdown_to_html

    html = markdown_to_html(["## Headline findings", "", "- m (all): tighter <b>", "- m (content)"])
    assert "<li>m (all): tighter &lt;b&gt;</li>" in html and "<li>m (content)</li>" in html
