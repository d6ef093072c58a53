"""The extraction task with each picture normalised in its row of the batch
(`workers.models.image_processing.normalized_into`: resized as decoded, converted to float32
into the row, rescaled and normalised there) against the route before 2026-12-07's eighth
session (resized as decoded, made channel-first, rescaled and normalised in a tensor of its
own, then copied into the batch: `load_stage_bench.normalised_apart`, kept as the baseline), in
one process, rounds interleaved (`interleaved.py` says how and what is reported).

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/normalise_rows_bench.py --models vit-b
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interleaved  # noqa: E402
from load_stage_bench import normalised_apart  # noqa: E402

import workers.models.hf as hf  # noqa: E402


@contextmanager
def apart(measured):
    """Each picture normalised in a tensor of its own, then copied into the batch."""
    extractor = measured.extractor
    saved = extractor.layout_processor, hf.normalized_into
    extractor.layout_processor = normalised_apart(extractor.processor)
    hf.normalized_into = lambda *args, **kwargs: None  # the processor's own route
    try:
        yield
    finally:
        extractor.layout_processor, hf.normalized_into = saved


@contextmanager
def in_rows(measured):
    """As the extractor runs now."""
    yield


if __name__ == "__main__":
    interleaved.main("normalise_rows_bench", __doc__.splitlines()[0], "vit-b,dinov2-l-reg",
                     {"apart": apart, "in rows": in_rows})
