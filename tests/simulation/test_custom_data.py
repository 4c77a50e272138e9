"""Custom data sets from arrays: the .npz file and the named function (custom_data.py, scenario).

The arrays are small and written by hand or by a seeded generator, so every expected size and
value can be worked out in the comments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedaudit_sim.custom_data import load_callable, load_npz, split_arrays
from fedaudit_sim.data_splits import DatasetFormatError, DatasetNotFoundError
from fedaudit_sim.preparation import prepare_data
from fedaudit_sim.scenario import ScenarioError, apply_overrides, validate_scenario


def blobs(n_per_class: int = 10, classes: int = 2, features: int = 3) -> tuple[Any, Any]:
    """``n_per_class`` samples of each class; class c sits around c in every feature."""
    gen = np.random.default_rng(0)
    y = np.repeat(np.arange(classes), n_per_class)
    x = y[:, None] + 0.1 * gen.normal(size=(y.size, features))
    return x, y


def given_split() -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    x, y = blobs(4)
    return (x, y), (x[:2] + 10.0, np.array([1, 0]))


def test_npz_round_trip_with_a_seeded_stratified_split(tmp_path: Path):
    x, y = blobs(10)  # 20 samples, 2 classes
    path = tmp_path / "mine.npz"
    np.savez(path, x=x, y=y)
    split = load_npz(path, test_fraction=0.2, seed=3, standardize=False)
    # 20% of 20 = 4 held out, stratified: 2 of each class.
    assert (len(split.train), len(split.test)) == (16, 4)
    assert np.bincount(split.test.y).tolist() == [2, 2]
    assert split.train.name == "mine"
    assert (split.train.kind, split.train.input_shape, split.train.num_classes) == (
        "tabular",
        (3,),
        2,
    )
    assert split.train.class_names == ("0", "1")
    # Unscaled: every row comes back once, with its label, in train or test.
    rows = np.concatenate([split.train.x, split.test.x])
    labels = np.concatenate([split.train.y, split.test.y])
    order = np.lexsort(rows.T[::-1])
    expected = np.lexsort(x.astype(np.float32).T[::-1])
    np.testing.assert_array_equal(rows[order], x.astype(np.float32)[expected])
    np.testing.assert_array_equal(labels[order], y[expected])
    # The same seed gives the same split; the default scales per feature on the train split.
    again = load_npz(path, test_fraction=0.2, seed=3, standardize=False)
    np.testing.assert_array_equal(again.test.x, split.test.x)
    scaled = load_npz(path, test_fraction=0.2, seed=3)
    np.testing.assert_allclose(scaled.train.x.mean(axis=0), 0.0, atol=1e-6)
    np.testing.assert_allclose(scaled.train.x.std(axis=0), 1.0, atol=1e-5)


def test_npz_with_its_own_test_split_and_images(tmp_path: Path):
    # (n, H, W) images: a channel axis is added. The given test split is used as is.
    x = np.arange(6 * 2 * 3, dtype=np.float64).reshape(6, 2, 3)
    path = tmp_path / "img.npz"
    np.savez(path, x=x, y=np.array([0, 1, 2, 0, 1, 2]), x_test=x[:3], y_test=np.array([2, 1, 0]))
    split = load_npz(path, standardize=False)
    assert (split.train.kind, split.train.input_shape, split.train.num_classes) == (
        "image",
        (1, 2, 3),
        3,
    )
    assert split.test.y.tolist() == [2, 1, 0]
    np.testing.assert_array_equal(split.test.x[:, 0], x[:3].astype(np.float32))


@pytest.mark.parametrize(
    ("arrays", "expected"),
    [
        ({"x": np.zeros((4, 2))}, r"missing \['y'\]"),
        ({"x": np.zeros((4, 2)), "y": np.zeros(4, int), "X": np.zeros(2)}, r"unexpected \['X'\]"),
        ({"x": np.zeros((4, 2)), "y": np.zeros(4)}, "integer class labels, got dtype float64"),
        ({"x": np.zeros((4, 2)), "y": np.zeros(3, int)}, "3 labels for 4 samples"),
        ({"x": np.zeros(4), "y": np.zeros(4, int)}, r"expected \(n, features\)"),
        ({"x": np.zeros((4, 2)), "y": np.array([0, 1, -1, 0])}, "negative label"),
        ({"x": np.full((4, 2), np.nan), "y": np.zeros(4, int)}, "NaN or infinite"),
        (
            {"x": np.zeros((4, 2)), "y": np.zeros(4, int), "x_test": np.zeros((2, 2))},
            "both x_test and y_test",
        ),
        (
            {"x": np.zeros((4, 2)), "y": np.array([0, 0, 0, 1])},
            "stratified split .* is impossible",
        ),
    ],
)
def test_npz_contract_errors(tmp_path: Path, arrays: dict[str, Any], expected: str):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DatasetFormatError, match=expected):
        load_npz(path, test_fraction=0.5)


def test_npz_missing_file_and_class_count(tmp_path: Path):
    with pytest.raises(DatasetNotFoundError, match="not found"):
        load_npz(tmp_path / "nope.npz")
    x, y = blobs(4)
    with pytest.raises(DatasetFormatError, match=r"label 1 is outside 0..0"):
        split_arrays(x, y, num_classes=1)
    with pytest.raises(DatasetFormatError, match="1 class_names for 2 classes"):
        split_arrays(x, y, class_names=["a"])
    # num_classes may exceed the labels present (a class no sample has).
    assert split_arrays(x, y, num_classes=3).train.num_classes == 3


def test_callable_from_a_module_and_from_a_file(tmp_path: Path):
    split = load_callable(
        "tests.simulation.test_custom_data:blobs", {"n_per_class": 5, "classes": 3}
    )
    # 15 samples, 20% = 3 held out: one per class.
    assert (len(split.train), len(split.test), split.train.num_classes) == (12, 3, 3)
    assert split.train.name == "blobs"
    pair = load_callable("tests.simulation.test_custom_data:given_split", standardize=False)
    assert pair.test.y.tolist() == [1, 0]
    assert len(pair.train) == 8
    source = tmp_path / "mydata.py"
    source.write_text(
        "import numpy as np\n"
        "def make(n=6):\n"
        "    return np.arange(n * 2.0).reshape(n, 2), np.arange(n) % 2\n"
    )
    from_file = load_callable(f"{source}:make", {"n": 10}, name="mine", test_fraction=0.4)
    assert (len(from_file.train), len(from_file.test), from_file.train.name) == (6, 4, "mine")


def returns_three() -> tuple[Any, Any, Any]:
    return np.zeros((2, 2)), np.zeros(2, int), None


def raises() -> Any:
    raise RuntimeError("no data today")


@pytest.mark.parametrize(
    ("target", "error", "expected"),
    [
        ("tests.simulation.test_custom_data:returns_three", DatasetFormatError, "returned tuple"),
        ("tests.simulation.test_custom_data:raises", DatasetFormatError, "RuntimeError: no data"),
        ("tests.simulation.test_custom_data:nothing", DatasetFormatError, "no function 'nothing'"),
        ("no_such_module_xyz:f", DatasetNotFoundError, "cannot be imported"),
        ("missing_file.py:f", DatasetNotFoundError, "not found"),
        ("no_colon", DatasetFormatError, "must be 'module:function'"),
    ],
)
def test_callable_errors(target: str, error: type[Exception], expected: str):
    with pytest.raises(error, match=expected):
        load_callable(target)


def test_custom_data_in_a_scenario_runs_through_prepare_data(tmp_path: Path):
    x, y = blobs(20, classes=3, features=4)  # 60 samples
    path = tmp_path / "three.npz"
    np.savez(path, x=x, y=y)
    scenario = validate_scenario(
        {
            "dataset": "custom",
            "custom_data": {"npz": str(path), "name": "three"},
            "clients": 4,
            "partition": {"method": "k_classes", "params": {"k": 2}},
            "noise": {"protocol": "rho_range", "params": {"noisy_clients": 1}},
        }
    )
    data = prepare_data(scenario, 0)
    # 20% of 60 = 12 test samples; 48 train samples over 4 clients, 2 classes each.
    assert (len(data.split.train), len(data.split.test)) == (48, 12)
    assert data.model_name == "mlp"
    for idx in data.client_indices:
        assert len(set(data.split.train.y[idx].tolist())) == 2
    assert int(data.noise.noisy_clients.sum()) == 1
    function = validate_scenario(
        {
            "dataset": "custom",
            "custom_data": {
                "function": "tests.simulation.test_custom_data:blobs",
                "params": {"n_per_class": 12},
            },
            "clients": 3,
        }
    )
    assert len(prepare_data(function, 1).split.train) == 19  # 24 - ceil(0.2 * 24) = 24 - 5


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"dataset": "custom"}, "dataset 'custom' needs custom_data"),
        ({"custom_data": {"npz": "a.npz"}}, "only used with dataset 'custom', not 'digits'"),
        (
            {"dataset": "custom", "custom_data": {"npz": "a.npz", "function": "m:f"}},
            "exactly one of npz",
        ),
        ({"dataset": "custom", "custom_data": {}}, "exactly one of npz"),
        ({"dataset": "custom", "custom_data": {"function": "m.f"}}, "must be 'module:function'"),
        (
            {"dataset": "custom", "custom_data": {"npz": "a.npz", "params": {"n": 1}}},
            "an npz source takes none",
        ),
        ({"dataset": "custom", "custom_data": {"npz": "a.npz", "shape": 1}}, "Extra inputs"),
    ],
)
def test_scenario_validation_of_custom_data(data: dict[str, Any], expected: str):
    with pytest.raises(ScenarioError, match=expected):
        validate_scenario(data)


def test_a_missing_npz_fails_when_the_run_is_prepared(tmp_path: Path):
    scenario = validate_scenario(
        {"dataset": "custom", "custom_data": {"npz": str(tmp_path / "gone.npz")}}
    )
    with pytest.raises(ScenarioError, match="dataset 'custom': npz file .* not found"):
        prepare_data(scenario, 0)


def test_overrides_switch_between_custom_and_built_in_data():
    custom = validate_scenario({"dataset": "custom", "custom_data": {"function": "m:f"}})
    # --data-npz replaces the function entirely (no merge into an npz-and-function spec).
    npz = apply_overrides(custom, {"custom_data": {"npz": "x.npz"}})
    assert npz.custom_data is not None
    assert (npz.custom_data.npz, npz.custom_data.function) == ("x.npz", None)
    # --dataset wine drops the custom arrays.
    wine = apply_overrides(custom, {"dataset": "wine"})
    assert (wine.dataset, wine.custom_data) == ("wine", None)


def test_the_example_scenario_is_valid_and_prepares(monkeypatch: pytest.MonkeyPatch):
    from fedaudit_sim.scenario import load_scenario

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the example's function path is relative to the repository root
    scenario = load_scenario(root / "examples" / "simulate_custom.yaml")
    data = prepare_data(scenario, 0)
    # 4 classes x 60 = 240 samples, 48 held out; 8 sites of exactly 2 classes; 3 noisy sites.
    assert (len(data.split.train), len(data.split.test)) == (192, 48)
    assert all(len(set(data.split.train.y[i].tolist())) == 2 for i in data.client_indices)
    assert int(data.noise.noisy_clients.sum()) == 3
