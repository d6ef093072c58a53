"""Tables know their categorical columns (Adult's, a CSV's text columns); row subsets keep ids."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from storage.errors import InputError
from workers.inputs import DatasetSpec, open_dataset
from workers.inputs.tabular import make_table


def test_adult_categorical_columns_become_categorical_features(monkeypatch):
    import sklearn.datasets

    frame = pd.DataFrame({
        "age": [25.0, 40.0, 31.0, 58.0],
        "workclass": pd.Categorical(["Private", "State-gov", "Private", None],
                                    categories=["Federal-gov", "Private", "State-gov"]),
        "hours": [40.0, 50.0, 20.0, 45.0],
        "class": ["<=50K", ">50K", "<=50K", ">50K"],
    })

    class Bunch:
        def __init__(self, frame):
            self.frame = frame

    monkeypatch.setattr(sklearn.datasets, "fetch_openml", lambda *a, **k: Bunch(frame.copy()))
    table = open_dataset(DatasetSpec(kind="tabular", source="sklearn:adult")).table
    assert table.feature_names == ("age", "workclass", "hours")
    assert (table.categorical, table.cardinalities, table.continuous) == ((1,), (3,), (0, 2))
    np.testing.assert_array_equal(table.features[:, 1], [1, 2, 1])  # the NaN row is dropped
    np.testing.assert_array_equal(table.target, [0, 1, 0])


def test_categorical_codes_must_fit_the_cardinality():
    with pytest.raises(InputError, match=r"feature 'c'.*integers in \[0, 2\)"):
        make_table(np.array([[0.5, 2.0]]), np.array([0]), "classification", ["x", "c"], {1: 2})
    plain = make_table(np.array([[0.5, 1.0]]), np.array([0]), "classification", ["x", "c"])
    coded = make_table(np.array([[0.5, 1.0]]), np.array([0]), "classification", ["x", "c"], {1: 2})
    assert plain.fingerprint != coded.fingerprint  # the checkpoint key sees the column types


def test_subset_keeps_the_ids_of_the_rows_and_the_whole_table():
    dataset = open_dataset(DatasetSpec(kind="tabular", source="sklearn:iris", limit=2))
    subset = dataset.subset([5, 1, 9])
    assert subset.ids == ("iris-5", "iris-1")  # the dataset's limit applies to the subset
    np.testing.assert_array_equal(subset.load([0])[0], dataset.table.features[5])
    assert subset.table is dataset.table and subset.rows.tolist() == [5, 1]
