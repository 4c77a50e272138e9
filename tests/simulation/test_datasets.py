"""Tests of fedaudit_sim.datasets: sklearn loaders, file loaders, checksums, IDX parsing."""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from fedaudit_sim import datasets
from fedaudit_sim.datasets import (
    DatasetChecksumError,
    DatasetError,
    DatasetFormatError,
    DatasetNotFoundError,
    UnknownDatasetError,
    load_dataset,
    sha256_file,
    verify_sha256,
)

_SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
_DATA_DIR = datasets.default_data_dir() or _SHARED


def _needs(sub: str) -> pytest.MarkDecorator:
    path = _DATA_DIR / sub
    return pytest.mark.skipif(
        not path.is_dir(),
        reason=f"real data set directory {path} is absent (set FEDAUDIT_DATASETS_DIR to run this)",
    )


# ------------------------------------------------------------------------------------------
# scikit-learn bundles (always available)


class TestSklearnLoaders:
    def test_digits_shapes_and_split_sizes(self):
        split = load_dataset("digits", test_fraction=0.2, seed=0)
        # 1797 samples; sklearn's train_test_split rounds the test size up: ceil(0.2*1797) = 360.
        assert split.test.x.shape == (360, 1, 8, 8)
        assert split.train.x.shape == (1797 - 360, 1, 8, 8)
        assert split.train.x.dtype == np.float32
        assert split.train.y.dtype == np.int64
        assert split.train.input_shape == (1, 8, 8)
        assert split.train.kind == "image"
        assert split.train.num_classes == 10
        assert split.train.class_names == tuple(str(d) for d in range(10))
        assert len(split.train) == 1437

    def test_digits_scaling_is_one_affine_map_fitted_on_train(self):
        split = load_dataset("digits", seed=0)
        # Raw pixels are the integers 0..16, so after /16 and (v - mean)/std there are at most 17
        # distinct values, equally spaced by 1/(16*std), and the SAME 17 values in train and test
        # (the test split uses the training statistics).
        values = np.unique(np.concatenate([split.train.x.ravel(), split.test.x.ravel()]))
        assert values.size == 17
        steps = np.diff(values.astype(np.float64))
        np.testing.assert_allclose(steps, steps[0], rtol=1e-5)
        # Training split standardised: mean 0, std 1 over all training pixels.
        assert abs(float(split.train.x.mean())) < 1e-5
        assert float(split.train.x.std()) == pytest.approx(1.0, abs=1e-5)
        # Pixel 0 (raw value 0) maps to -mean/std, the smallest value.
        assert values[0] == split.train.x.min()

    @pytest.mark.parametrize(
        ("name", "n_total", "n_features", "counts"),
        [
            # README: breast cancer 212 malignant / 357 benign; wine 59/71/48.
            ("breast_cancer", 569, 30, (212, 357)),
            ("wine", 178, 13, (59, 71, 48)),
        ],
    )
    def test_tabular_standardised_per_feature_and_stratified(
        self, name, n_total, n_features, counts
    ):
        split = load_dataset(name, test_fraction=0.25, seed=3)
        train, test = split.train, split.test
        assert train.kind == "tabular"
        assert train.input_shape == (n_features,)
        assert len(train) + len(test) == n_total
        np.testing.assert_allclose(train.x.mean(axis=0), 0.0, atol=1e-5)
        np.testing.assert_allclose(train.x.std(axis=0), 1.0, atol=1e-4)
        # Stratified: each class's test count is within 1 of 25% of its total.
        test_counts = np.bincount(test.y, minlength=len(counts))
        for total, got in zip(counts, test_counts, strict=True):
            assert abs(got - 0.25 * total) <= 1.0

    def test_same_seed_same_split_and_different_seed_different_split(self):
        a = load_dataset("wine", seed=1)
        b = load_dataset("wine", seed=1)
        c = load_dataset("wine", seed=2)
        np.testing.assert_array_equal(a.train.x, b.train.x)
        np.testing.assert_array_equal(a.test.y, b.test.y)
        assert not np.array_equal(a.train.x, c.train.x)

    def test_unknown_name_and_bad_arguments(self):
        with pytest.raises(UnknownDatasetError, match="cifar10"):
            load_dataset("cifar10")
        with pytest.raises(DatasetError, match="test_fraction"):
            load_dataset("digits", test_fraction=1.0)
        with pytest.raises(DatasetError, match="test_fraction"):
            load_dataset("digits", test_fraction=0.0)
        with pytest.raises(DatasetError, match="seed"):
            load_dataset("digits", seed=-1)
        assert issubclass(UnknownDatasetError, ValueError)


# ------------------------------------------------------------------------------------------
# checksums and missing files (no real data needed)


def test_sha256_of_a_known_string(tmp_path):
    path = tmp_path / "abc.txt"
    path.write_bytes(b"abc")
    # FIPS 180-2 test vector: sha256("abc").
    expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha256_file(path) == expected
    verify_sha256(path, expected.upper())  # case-insensitive, no error
    with pytest.raises(DatasetChecksumError):
        verify_sha256(path, "0" * 64)


@pytest.mark.parametrize(
    ("name", "relative"),
    [
        ("breastmnist", "breastmnist/breastmnist.npz"),
        ("pneumoniamnist", "pneumoniamnist/pneumoniamnist.npz"),
        ("mnist", "mnist/t10k-images-idx3-ubyte.gz"),
    ],
)
def test_checksum_mismatch_on_a_tiny_fake_file(tmp_path, name, relative):
    fake = tmp_path / relative
    fake.parent.mkdir(parents=True)
    fake.write_bytes(b"definitely not the published file")
    with pytest.raises(DatasetChecksumError, match="sha256"):
        load_dataset(name, data_dir=tmp_path)


def test_missing_file_says_where_it_looked(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=re.escape(str(tmp_path))) as info:
        load_dataset("breastmnist", data_dir=tmp_path)
    assert isinstance(info.value, FileNotFoundError)
    assert "FEDAUDIT_DATASETS_DIR" in str(info.value)
    assert "--datasets-dir" in str(info.value)  # what a user of fedaudit simulate types


def test_without_the_variable_the_default_is_shared_data_beside_the_repository(monkeypatch):
    # The checkout's own parent: <repo>/../shared/data (_SHARED), whether or not it exists here.
    monkeypatch.delenv("FEDAUDIT_DATASETS_DIR", raising=False)
    assert datasets.default_data_dir() == (_SHARED if _SHARED.is_dir() else None)
    if not _SHARED.is_dir():
        with pytest.raises(DatasetNotFoundError, match=re.escape(str(_SHARED))):
            load_dataset("mnist")


def test_environment_variable_is_the_default_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAUDIT_DATASETS_DIR", str(tmp_path))
    assert datasets.default_data_dir() == tmp_path
    with pytest.raises(DatasetNotFoundError, match=re.escape(str(tmp_path))):
        load_dataset("mnist")


def _write_idx(path: Path, magic: int, array: np.ndarray) -> None:
    header = np.array([magic, *array.shape], dtype=">u4").tobytes()
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def _register(monkeypatch, relative: str, path: Path) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setitem(datasets.FILE_SHA256, relative, digest)


def test_idx_parser_on_a_handmade_file(tmp_path, monkeypatch):
    # Prepare: 20 images, image i filled with the value 10*i (0..190), labels 0,1,0,1,...
    (tmp_path / "mnist").mkdir()
    images = np.repeat(np.arange(20, dtype=np.uint8)[:, None, None] * 10, 28 * 28).reshape(
        20, 28, 28
    )
    labels = np.arange(20) % 2
    img_path = tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz"
    lab_path = tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz"
    _write_idx(img_path, 0x00000803, images)
    _write_idx(lab_path, 0x00000801, labels)
    _register(monkeypatch, "mnist/t10k-images-idx3-ubyte.gz", img_path)
    _register(monkeypatch, "mnist/t10k-labels-idx1-ubyte.gz", lab_path)

    # Execute
    split = load_dataset("mnist", data_dir=tmp_path, test_fraction=0.5, seed=0)

    # Assert: 10/10 split, stratified (5 of each label in each half), one image per value.
    assert split.train.x.shape == (10, 1, 28, 28)
    assert np.bincount(split.test.y).tolist() == [5, 5]
    # Each image is constant with value 10*i and label i % 2; the standardisation is monotone,
    # so sorting the images by their standardised pixel must give back labels 0,1,0,1,...
    values = np.concatenate([split.train.x[:, 0, 0, 0], split.test.x[:, 0, 0, 0]])
    labels_out = np.concatenate([split.train.y, split.test.y])
    order = np.argsort(values)
    assert labels_out[order].tolist() == [i % 2 for i in range(20)]


def test_idx_bad_magic_is_a_format_error(tmp_path, monkeypatch):
    (tmp_path / "mnist").mkdir()
    img_path = tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz"
    lab_path = tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz"
    _write_idx(img_path, 0x00000801, np.zeros((4, 28, 28)))  # labels magic on the images file
    _write_idx(lab_path, 0x00000801, np.zeros(4))
    _register(monkeypatch, "mnist/t10k-images-idx3-ubyte.gz", img_path)
    _register(monkeypatch, "mnist/t10k-labels-idx1-ubyte.gz", lab_path)
    with pytest.raises(DatasetFormatError, match="magic"):
        load_dataset("mnist", data_dir=tmp_path)


def test_medmnist_train_plus_val_on_a_handmade_archive(tmp_path, monkeypatch):
    # Prepare: 3 train, 2 val, 2 test images; labels shaped (N, 1) as MedMNIST publishes them.
    (tmp_path / "breastmnist").mkdir()
    path = tmp_path / "breastmnist" / "breastmnist.npz"
    img = np.zeros((1, 28, 28), dtype=np.uint8)
    np.savez(
        path,
        train_images=np.concatenate([img, img + 255, img]),
        train_labels=np.array([[0], [1], [1]], dtype=np.uint8),
        val_images=np.concatenate([img + 255, img]),
        val_labels=np.array([[0], [1]], dtype=np.uint8),
        test_images=np.concatenate([img, img + 255]),
        test_labels=np.array([[1], [0]], dtype=np.uint8),
    )
    _register(monkeypatch, "breastmnist/breastmnist.npz", path)

    split = load_dataset("breastmnist", data_dir=tmp_path)

    assert split.train.y.tolist() == [0, 1, 1, 0, 1]  # train then val
    assert split.test.y.tolist() == [1, 0]
    assert split.train.class_names == ("malignant", "normal_or_benign")
    # Training pixels after /255: images 0,1,0,1,0 -> per image all 0 or all 1. Over all pixels
    # mean = 2/5 = 0.4, std = sqrt(0.4*0.6) = 0.4899. A black pixel -> (0-0.4)/0.4899 = -0.8165,
    # a white pixel -> (1-0.4)/0.4899 = 1.2247; the test split uses the same map.
    np.testing.assert_allclose(
        split.train.x[:, 0, 0, 0], [-0.8165, 1.2247, -0.8165, 1.2247, -0.8165], atol=1e-4
    )
    np.testing.assert_allclose(split.test.x[:, 0, 0, 0], [-0.8165, 1.2247], atol=1e-4)


# ------------------------------------------------------------------------------------------
# the real files under ../shared/data (skipped when absent)


@pytest.mark.data
@_needs("pneumoniamnist")
def test_pneumoniamnist_real_file():
    split = load_dataset("pneumoniamnist", data_dir=_DATA_DIR)
    # README: train 4708 + val 524 = 5232, test 624; normals 1214 + 135 = 1349 train, 234 test.
    assert split.train.x.shape == (5232, 1, 28, 28)
    assert split.test.x.shape == (624, 1, 28, 28)
    assert np.bincount(split.train.y).tolist() == [1349, 5232 - 1349]
    assert np.bincount(split.test.y).tolist() == [234, 390]
    assert split.train.class_names == ("normal", "pneumonia")


@pytest.mark.data
@_needs("breastmnist")
def test_breastmnist_real_file():
    split = load_dataset("breastmnist", data_dir=_DATA_DIR)
    # README: train 546 + val 78 = 624, test 156; malignant 147 + 21 = 168 train, 42 test.
    assert split.train.x.shape == (624, 1, 28, 28)
    assert np.bincount(split.train.y).tolist() == [168, 456]
    assert np.bincount(split.test.y).tolist() == [42, 114]


@pytest.mark.data
@_needs("mnist")
def test_mnist_real_test_set():
    split = load_dataset("mnist", data_dir=_DATA_DIR, test_fraction=0.2, seed=0)
    assert split.train.x.shape == (8000, 1, 28, 28)
    assert split.test.x.shape == (2000, 1, 28, 28)
    counts = np.bincount(np.concatenate([split.train.y, split.test.y]))
    # README class balance of the 10,000 test images.
    assert counts.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert split.train.num_classes == 10
