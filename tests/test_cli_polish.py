"""The command line's small contracts: one `--format` scheme on every command, help generated
from the registries, `sweep status` columns that fit generated names, `rollout: off` unquoted."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from storage.errors import InputError
from storage.query.status import StageStatus
from sweep.cli.commands.status import text_lines
from sweep.cli.entry import COMMANDS, build_parser, main
from sweep.cli.outputs import FORMAT_ALIASES, FORMATS
from sweep.config.load import parse_config
from workers.models.registry import PRESETS, TRAINED_FAMILIES


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, by name."""
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def format_action(parser: argparse.ArgumentParser) -> argparse.Action | None:
    return next((a for a in parser._actions if "--format" in a.option_strings), None)


def test_every_format_option_takes_names_of_the_one_scheme_with_text_the_default():
    seen = {}
    for name, parser in subparsers().items():
        action = format_action(parser)
        if action is None:
            continue
        seen[name] = tuple(action.choices)
        assert set(action.choices) <= set(FORMATS) and "text" in action.choices, name
        # `sweep report` without --format prints text, or nothing when --html writes a page
        assert action.default == ("text" if name != "report" else None), name
    assert set(seen) == {"check", "baseline", "plan", "status", "report", "compare",
                         "precision"} <= set(COMMANDS)


@pytest.mark.parametrize("command", ["report", "precision", "status", "check"])
def test_md_still_names_the_text_format(command):
    parser = subparsers()[command]
    words = {"report": ["s.zarr"], "precision": ["s.zarr", "--dtype", "bfloat16"],
             "status": ["s.zarr"], "check": ["a.npy"]}[command]
    for alias, meant in FORMAT_ALIASES.items():
        assert parser.parse_args([*words, "--format", alias]).format == meant


def test_check_and_baseline_print_their_table_by_default(tmp_path, capsys):
    np.save(tmp_path / "eye.npy", np.eye(3))
    assert main(["check", str(tmp_path / "eye.npy")]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:2] == ["matrix", "kappa"]
    assert main(["baseline", "--sizes", "2", "--trials", "100", "--format", "md"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:2] == ["null", "n"]


def test_extract_help_lists_every_preset_and_the_models_trained_here(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at the terminal's width
    with pytest.raises(SystemExit):
        main(["extract", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    trained = [name for name, spec in PRESETS.items() if spec.family in TRAINED_FAMILIES]
    assert {"ft-transformer", "vit-digits"} <= set(trained)
    assert f"trained here (first, then cached) {', '.join(trained)};" in help_text
    for name in PRESETS:
        assert name in help_text, name


def test_status_scope_column_is_as_wide_as_the_longest_scope():
    stages = [StageStatus("ft-cancer@seed0@random-init", "extract", done=4),
              StageStatus("minilm-l6", "test", done=3, pending=1)]
    lines = text_lines(stages, [])
    columns = [line.index(word) for line, word in zip(lines, ["stage", "extract", "test"],
                                                      strict=True)]
    assert len(set(columns)) == 1 and columns[0] > len("ft-cancer@seed0@random-init")
    assert lines[1].split() == ["ft-cancer@seed0@random-init", "extract", "4", "0", "0", "4"]


@pytest.mark.parametrize("written", ["off", "Off", "no", "false"])
def test_rollout_off_unquoted_reads_as_off(written):
    from sweep.config.yaml_io import load_yaml

    data = load_yaml(f"store: /tmp/never.zarr\nrollout: {written}\n", "sweep.yaml")
    assert data["rollout"] is False  # YAML 1.1: what the user wrote is a boolean
    assert parse_config(data).rollout == "off"


@pytest.mark.parametrize("written", ["on", "yes", "true"])
def test_rollout_on_unquoted_is_refused_saying_to_quote_a_mode(written):
    from sweep.config.yaml_io import load_yaml

    data = load_yaml(f"store: /tmp/never.zarr\nrollout: {written}\n", "sweep.yaml")
    with pytest.raises(InputError, match="rollout: .*give one of 'every', 'last' or 'off', "
                                         "in quotes"):
        parse_config(data)


def test_rollout_off_is_only_read_so_for_rollout():
    with pytest.raises(InputError, match="rollout_device"):
        parse_config({"store": "/tmp/never.zarr", "rollout_device": False})
