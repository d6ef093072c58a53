"""FT-Transformer options: checked at resolve time, one-line errors naming option and values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from storage.errors import InputError
from workers.models.registry import ModelSpec, resolve_model
from workers.models.trained.ft.options import measured_layers


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"split": "train"}, r"option split='train' must be one of \['test', 'all'\]"),
        ({"last_block": "cls"}, r"option last_block='cls' must be one of \['skip', 'full'\]"),
        ({"d_block": 12}, r"option d_block=12 must be null or a positive multiple of 8"),
        ({"preprocessing": "minmax"},
         r"option preprocessing='minmax' must be one of \['quantile', 'standard'\]"),
        ({"patience": 0}, r"option patience=0 must be an integer >= 1"),
        ({"n_blocks": 1}, r"last_block='skip' needs n_blocks >= 2"),
    ],
)
def test_bad_options_are_one_line_errors(option, match):
    with pytest.raises(InputError, match=match) as error:
        resolve_model("ft-transformer", **option)
    assert "\n" not in str(error.value)


def test_defaults_measure_the_test_rows_and_skip_the_last_block():
    spec = resolve_model("ft-transformer")
    assert (spec.options["split"], spec.options["last_block"]) == ("test", "skip")
    assert spec.options["patience"] == 16 and not spec.random_init


def test_measured_layers_drop_the_last_block_with_skip():
    skip = resolve_model("ft-transformer", n_blocks=3)
    full = resolve_model("ft-transformer", n_blocks=3, last_block="full")
    assert (measured_layers(skip.options), measured_layers(full.options)) == (2, 3)
    assert measured_layers(resolve_model("ft-transformer", n_blocks=1,
                                         last_block="full").options) == 1


def test_random_init_is_part_of_the_spec_and_round_trips():
    spec = resolve_model("ft-transformer", n_blocks=2)
    control = replace(spec, random_init=True)
    assert control != spec and control.to_dict()["random_init"] is True
    assert ModelSpec.from_dict(control.to_dict()) == control
