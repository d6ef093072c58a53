"""The findings about training that README.md and docs/training.md state are the report's: the
over-training findings the report's own code reads from its trajectory tables (kept from the
bundled run in docs/figures/, `benchmarks/training_findings.py`), quoted word for word."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from sweep.report.training import pair_findings, trajectory_findings

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- findings: (?P<file>\S+) -->\n(?P<body>.*?)<!-- /findings -->", re.S)


def quoted_blocks() -> list[tuple[str, str, list[str]]]:
    """(document, findings file, the bullet texts) of every findings block in the docs."""
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in BLOCK.finditer(doc.read_text(encoding="utf-8")):
            bullets = [line[2:] for line in match["body"].splitlines() if line.startswith("- ")]
            out.append((doc.name, match["file"], bullets))
    return out


def report_findings(file: str) -> list[str]:
    """The findings the report's code reads from the kept tables of `file`."""
    document = json.loads((ROOT / file).read_text(encoding="utf-8"))
    floats = lambda records: pd.DataFrame(records).map(  # noqa: E731 - JSON null is NaN here
        lambda v: math.nan if v is None else v)
    trajectory = floats(document["trajectory"])
    trajectory[["rates", "epochs", "seeds"]] = pd.DataFrame(document["trajectory"])[
        ["rates", "epochs", "seeds"]]
    texts = list(trajectory_findings(trajectory, document["ci_method"])["text"])
    pairs = pd.DataFrame(document["trajectory_pairs"])
    texts += list(pair_findings(pairs.fillna(math.nan))["text"])
    assert texts == [f["text"] for f in document["findings"]], file  # the file is the report's
    return texts


def test_the_docs_quote_findings_blocks():
    names = {doc for doc, _, _ in quoted_blocks()}
    assert {"README.md", "training.md"} <= names


@pytest.mark.parametrize(("doc", "file", "bullets"), quoted_blocks())
def test_every_quoted_finding_is_the_reports_word_for_word(doc, file, bullets):
    findings = report_findings(file)
    assert bullets and all(bullet in findings for bullet in bullets), doc
    if doc != "README.md":  # the full list where the docs give it
        assert bullets == findings


def test_the_training_findings_never_call_an_unresolved_difference_no_change():
    for doc in (ROOT / "README.md", ROOT / "docs" / "training.md"):
        text = doc.read_text(encoding="utf-8").lower()
        for phrase in ("no change", "end where they began", "ends where it began",
                       "unchanged by training"):
            assert phrase not in text, (doc.name, phrase)
