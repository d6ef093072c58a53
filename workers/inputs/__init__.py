"""Datasets of inputs for extraction: images, text and tabular rows, each with stable ids.

`open_dataset(DatasetSpec(...))` returns a `Dataset` whose `ids` are stable and whose positions
are deterministic, so shards of `range(len(dataset))` are reproducible. `limit` keeps the first N.

Source forms (`DatasetSpec.source`; or `path` for a file/folder):
    image:   a folder (recursive, sorted; ids are relative paths) | sklearn:sample_images
             | sklearn:digits (with kind image: the 8 x 8 digits as greyscale images)
    text:    a .txt file, one input per line | pydoc:topics | hf:<dataset name> (needs `datasets`)
    tabular: a .csv file with a `target` column | sklearn:<breast_cancer|wine|iris|diabetes|digits>
             | sklearn:california_housing, sklearn:adult (downloaded by scikit-learn: online only)
"""

from __future__ import annotations

from workers.inputs.base import KINDS, Dataset, DatasetSpec, Table, infer_kind, open_dataset

__all__ = ["KINDS", "Dataset", "DatasetSpec", "Table", "infer_kind", "open_dataset"]
