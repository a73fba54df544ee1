"""Tests for fedbayes_flwr.data: dataset loading and client partitions."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedbayes_flwr.data import (
    DATASETS,
    HUB_PREFIX,
    PARTITIONS,
    SYNTHETIC,
    TARGETS,
    DataError,
    Dataset,
    DataWarning,
    is_dataset_name,
    load_dataset,
    partition_indices,
)
from fedbayes_flwr.data.synthetic import DEFAULT_SYNTHETIC, GENERATORS, SYNTHETIC_TARGET

# Model name -> (target kind, synthetic generator), as the models declare them.
MODELS = {
    "gaussian-mean": ("none", "gaussian-mean"),
    "linear-regression": ("real", "linear"),
    "logistic-regression": ("binary", "logistic"),
    "bnn-classifier": ("multiclass", "softmax"),
    "bnn-regression": ("real", "sine"),
    "logistic-hyperprior": ("binary", "logistic"),
}


def _load(name: str, model: str, **kwargs) -> Dataset:
    """``load_dataset`` for the target kind and synthetic generator of `model`."""
    target, synthetic = MODELS[model]
    return load_dataset(name, target, synthetic=synthetic, **kwargs)


@pytest.fixture(scope="module")
def cancer() -> Dataset:
    return load_dataset("breast-cancer", "binary")


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits", "multiclass")


def _check_float(a: np.ndarray, shape: tuple[int, ...]) -> None:
    assert a.dtype == np.float64
    assert a.flags.c_contiguous
    assert a.shape == shape


def _check_cover(parts: list[np.ndarray], n: int, k: int) -> None:
    assert len(parts) == k
    for p in parts:
        assert p.dtype == np.int64
        assert p.size > 0
        assert np.all(np.diff(p) > 0)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _mean_tv(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    classes = np.unique(labels)
    glob = np.array([np.mean(labels == c) for c in classes])
    tvs = [
        0.5 * np.abs(np.array([np.mean(labels[p] == c) for c in classes]) - glob).sum()
        for p in parts
    ]
    return float(np.mean(tvs))


# ------------------------------------------------------------------------ embedded


def test_constants():
    assert DATASETS == ("breast-cancer", "diabetes", "digits", "synthetic", "twonorm", "mixture-1d",
                        "amps-mixture", "amps-gaussian", "lda-corpus", "latent-features", "mnist-like")
    assert PARTITIONS == ("iid", "dirichlet", "pathological", "natural")
    assert TARGETS == ("none", "real", "binary", "multiclass")
    assert SYNTHETIC == ("gaussian-mean", "linear", "logistic", "softmax", "sine", "mixture-1d",
                         "ar1-student-t")
    assert HUB_PREFIX == "hub:"
    assert issubclass(DataError, ValueError)
    assert issubclass(DataWarning, UserWarning)
    # Positional construction without holdout_rows still works.
    d = Dataset(np.zeros((1, 1)), None, np.zeros((1, 1)), None, None, "x")
    assert d.holdout_rows == 0


def test_data_package_knows_no_models():
    import pathlib

    import fedbayes_flwr.data as data

    for path in pathlib.Path(data.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert ".models" not in text and "import flwr\n" not in text and "from flwr " not in text, path
        for model in MODELS:
            if model != "gaussian-mean":  # also a generator name
                assert model not in text, (path, model)


def test_models_known_to_the_library():
    from fedbayes_flwr.models import MODELS as LIBRARY_MODELS

    assert set(MODELS) <= set(LIBRARY_MODELS)
    for target, synthetic in MODELS.values():
        assert target in TARGETS and synthetic in SYNTHETIC
        assert SYNTHETIC_TARGET[synthetic] == target


def test_models_declare_their_target_and_generator():
    from fedbayes_flwr.models import make_model

    for name, expected in MODELS.items():
        model = make_model(name)
        assert (model.target, model.synthetic) == expected, name


@pytest.mark.parametrize(
    ("name", "ok"),
    [("digits", True), ("synthetic", True), ("hub:mnist", True), ("hub:ylecun/mnist", True),
     ("hub:", False), ("hub: ", False), ("mnist", False), ("", False)],
)
def test_is_dataset_name(name, ok):
    assert is_dataset_name(name) is ok


def test_breast_cancer(cancer):
    d = cancer
    _check_float(d.x_train, (455, 30))
    _check_float(d.x_test, (114, 30))
    assert d.y_train.dtype == np.int64 and d.y_test.dtype == np.int64
    assert d.y_train.shape == (455,) and d.y_test.shape == (114,)
    assert set(np.unique(d.y_train)) == {0, 1}
    assert d.client_id is None and d.name == "breast-cancer" and d.holdout_rows == 0
    np.testing.assert_allclose(d.x_train.mean(axis=0), 0.0, atol=1e-9)
    np.testing.assert_allclose(d.x_train.std(axis=0), 1.0, atol=1e-9)
    # Stratified: class balance of both sides close to the whole set.
    assert abs(d.y_train.mean() - d.y_test.mean()) < 0.02
    # Fixed split: deterministic and independent of the run seed.
    other = load_dataset("breast-cancer", "binary", seed=123)
    for a, b in zip(d, other, strict=True):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)


def test_breast_cancer_multiclass(cancer):
    d = load_dataset("breast-cancer", "multiclass")
    for a, b in zip(d, cancer, strict=True):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)


def test_diabetes_bnn_regression():
    a = _load("diabetes", "bnn-regression")  # the generator only matters for "synthetic"
    b = _load("diabetes", "linear-regression")
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert a.y_train.dtype == np.float64


def test_digits(digits):
    d = digits
    _check_float(d.x_train, (1437, 64))
    _check_float(d.x_test, (360, 64))
    assert d.y_train.dtype == np.int64 and d.y_test.dtype == np.int64
    assert d.y_train.shape == (1437,) and d.y_test.shape == (360,)
    assert d.client_id is None and d.name == "digits"
    # Pixels 0..16 scaled by 1/16, not standardised.
    for x in (d.x_train, d.x_test):
        assert x.min() == 0.0 and x.max() == 1.0
        np.testing.assert_array_equal(x * 16, np.round(x * 16))
    assert set(np.unique(d.y_train)) == set(range(10)) == set(np.unique(d.y_test))
    # Stratified: class shares of the test side match the training side.
    counts_tr, counts_te = np.bincount(d.y_train), np.bincount(d.y_test)
    np.testing.assert_allclose(counts_te / 360, counts_tr / 1437, atol=0.01)
    # Fixed split: deterministic and independent of the run seed.
    other = load_dataset("digits", "multiclass", seed=99)
    for a, b in zip(d, other, strict=True):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
    half = load_dataset("digits", "multiclass", test_fraction=0.5)
    assert half.x_train.shape == (898, 64) and half.x_test.shape == (899, 64)


def test_diabetes():
    d = load_dataset("diabetes", "real", seed=5)
    _check_float(d.x_train, (353, 10))
    _check_float(d.x_test, (89, 10))
    _check_float(d.y_train, (353,))
    _check_float(d.y_test, (89,))
    np.testing.assert_allclose(d.x_train.mean(axis=0), 0.0, atol=1e-9)
    np.testing.assert_allclose(d.x_train.std(axis=0), 1.0, atol=1e-9)
    assert abs(d.y_train.mean()) < 1e-9 and abs(d.y_train.std() - 1.0) < 1e-9
    np.testing.assert_array_equal(d.y_test, load_dataset("diabetes", "real").y_test)


@pytest.mark.parametrize(
    ("name", "target", "needle"),
    [
        ("breast-cancer", "real", "^dataset 'breast-cancer' has binary labels; this model needs real-valued"),
        ("breast-cancer", "none", "'breast-cancer' has binary labels; this model needs no targets"),
        ("diabetes", "binary", "^dataset 'diabetes' has real-valued targets; this model needs binary labels"),
        ("diabetes", "multiclass", "'diabetes' has real-valued targets; this model needs class labels"),
        ("digits", "binary", "^dataset 'digits' has 10-class labels; this model needs binary labels"),
        ("digits", "real", "'digits' has 10-class labels; this model needs real-valued targets"),
        ("digits", "none", "'digits' has 10-class labels; this model needs no targets"),
        ("mnist", "binary", "breast-cancer, diabetes, digits, synthetic, twonorm, mixture-1d, "
                              "amps-mixture, amps-gaussian, lda-corpus, latent-features, mnist-like or hub:"),
    ],
)
def test_bad_dataset_target(name, target, needle):
    with pytest.raises(DataError, match=needle) as info:
        load_dataset(name, target)
    assert "\n" not in str(info.value) and "--model" not in str(info.value)


@pytest.mark.parametrize("name", ["synthetic", "digits", "hub:mnist"])
@pytest.mark.parametrize("target", ["poisson", "", "logistic-regression", None])
def test_unknown_target(name, target):
    with pytest.raises(DataError, match="^unknown target .*; known targets: none, real, binary, multiclass$"):
        load_dataset(name, target)


def test_unknown_synthetic_generator():
    needle = "unknown synthetic generator 'poisson'; known: gaussian-mean, linear"
    with pytest.raises(DataError, match=needle):
        load_dataset("synthetic", "real", synthetic="poisson")


@pytest.mark.parametrize(
    ("target", "synthetic", "needle"),
    [
        ("binary", "linear", "generator 'linear' makes real-valued targets; this model needs binary"),
        ("real", "softmax", "generator 'softmax' makes class labels.*; this model needs real-valued"),
        ("none", "sine", "generator 'sine' makes real-valued targets; this model needs no targets"),
        ("real", "gaussian-mean", "generator 'gaussian-mean' makes no targets; this model needs real"),
        ("binary", "softmax", "this model needs binary labels"),
    ],
)
def test_synthetic_generator_must_fit_target(target, synthetic, needle):
    with pytest.raises(DataError, match=needle):
        load_dataset("synthetic", target, synthetic=synthetic)


def test_binary_generator_fits_multiclass():
    d = load_dataset("synthetic", "multiclass", synthetic="logistic", seed=3)
    e = load_dataset("synthetic", "binary", seed=3)
    np.testing.assert_array_equal(d.y_train, e.y_train)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_bad_test_fraction(fraction):
    with pytest.raises(DataError, match="test fraction"):
        load_dataset("synthetic", "none", test_fraction=fraction)


@pytest.mark.parametrize("model", MODELS)
def test_synthetic(model):
    d = _load("synthetic", model, seed=1, synthetic_size=50, synthetic_dim=4)
    _check_float(d.x_train, (40, 4))
    _check_float(d.x_test, (10, 4))
    assert d.name == "synthetic" and d.client_id is None and d.holdout_rows == 0
    if model == "gaussian-mean":
        assert d.y_train is None and d.y_test is None
    elif model in ("linear-regression", "bnn-regression"):
        _check_float(d.y_train, (40,))
        _check_float(d.y_test, (10,))
    else:
        assert d.y_train.dtype == np.int64 and d.y_train.shape == (40,)
        classes = {0, 1, 2} if model == "bnn-classifier" else {0, 1}
        assert set(np.unique(np.concatenate([d.y_train, d.y_test]))) <= classes
    again = _load("synthetic", model, seed=1, synthetic_size=50, synthetic_dim=4)
    other = _load("synthetic", model, seed=2, synthetic_size=50, synthetic_dim=4)
    np.testing.assert_array_equal(d.x_train, again.x_train)
    if d.y_train is not None:
        np.testing.assert_array_equal(d.y_train, again.y_train)
    assert not np.array_equal(d.x_train, other.x_train)


def test_synthetic_generators_cover_the_names():
    assert set(GENERATORS) == set(SYNTHETIC) == set(SYNTHETIC_TARGET)
    assert set(SYNTHETIC_TARGET.values()) == set(TARGETS)
    assert set(DEFAULT_SYNTHETIC) == set(TARGETS)
    for target, synthetic in DEFAULT_SYNTHETIC.items():
        assert SYNTHETIC_TARGET[synthetic] == target


@pytest.mark.parametrize("synthetic", SYNTHETIC)
def test_synthetic_generator_is_deterministic_per_seed(synthetic):
    target = SYNTHETIC_TARGET[synthetic]
    kwargs = {"synthetic": synthetic, "synthetic_size": 40, "synthetic_dim": 2}
    for seed in (0, 1, 12345):
        a = load_dataset("synthetic", target, seed=seed, **kwargs)
        b = load_dataset("synthetic", target, seed=seed, **kwargs)
        for u, v in zip(a, b, strict=True):
            if isinstance(u, np.ndarray):
                np.testing.assert_array_equal(u, v)
            else:
                assert u == v
        # The generator itself: same seed, same draws.
        x1, y1 = GENERATORS[synthetic](np.random.default_rng(seed), 40, 2, 1.0)
        x2, y2 = GENERATORS[synthetic](np.random.default_rng(seed), 40, 2, 1.0)
        np.testing.assert_array_equal(x1, x2)
        assert (y1 is None) == (y2 is None) == (target == "none")
        if y1 is not None:
            np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(np.concatenate([a.x_train, a.x_test]), x1)
    other = load_dataset("synthetic", target, seed=2, **kwargs)
    assert not np.array_equal(a.x_train, other.x_train)


@pytest.mark.parametrize(("target", "synthetic"), DEFAULT_SYNTHETIC.items())
def test_synthetic_default_generator_per_target(target, synthetic):
    a = load_dataset("synthetic", target, seed=4)
    b = load_dataset("synthetic", target, synthetic=synthetic, seed=4)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    if a.y_train is not None:
        np.testing.assert_array_equal(a.y_train, b.y_train)


def test_synthetic_bnn_classifier_has_three_classes():
    d = _load("synthetic", "bnn-classifier", synthetic_size=600, synthetic_dim=4, seed=3)
    counts = np.bincount(np.concatenate([d.y_train, d.y_test]), minlength=3)
    assert counts.size == 3 and counts.min() > 30


def test_synthetic_bnn_regression_is_nonlinear():
    d = _load("synthetic", "bnn-regression", synthetic_size=2000, noise_scale=0.05, seed=0)
    x, y = d.x_train, d.y_train
    assert np.all(np.abs(y) < 2.5)  # 2 sin(.) plus small noise
    # A linear fit explains much less of y than the noise level allows.
    design = np.column_stack([x, np.ones(len(x))])
    resid = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    assert resid.std() > 10 * 0.05


def test_synthetic_tiny_keeps_one_row_each_side():
    d = load_dataset("synthetic", "real", synthetic_size=2, test_fraction=0.01)
    assert d.x_train.shape[0] == 1 and d.x_test.shape[0] == 1


# ----------------------------------------------------------------------------- npz


def _write(tmp_path, **arrays) -> str:
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return str(path)


def test_npz_with_test_set(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((20, 3)), rng.standard_normal(20)
    xt, yt = rng.standard_normal((5, 3)), rng.standard_normal(5)
    path = _write(tmp_path, x_train=x, y_train=y, x_test=xt, y_test=yt)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # nothing held out: no warning
        d = load_dataset("breast-cancer", "real", data_file=path)
    assert d.name == "file:data.npz" and d.holdout_rows == 0
    np.testing.assert_array_equal(d.x_train, x)  # not standardised
    np.testing.assert_array_equal(d.y_train, y)
    np.testing.assert_array_equal(d.x_test, xt)
    np.testing.assert_array_equal(d.y_test, yt)
    assert d.client_id is None


def test_npz_split_and_client_id(tmp_path):
    n = 30
    x = np.arange(n, dtype=np.float64)  # 1-D -> (n, 1)
    y = (np.arange(n) % 2).astype(np.int32)
    cid = np.repeat(np.array([7, 3, 5]), 10)
    path = _write(tmp_path, x_train=x, y_train=y, client_id=cid)
    with pytest.warns(DataWarning, match="held out 6 of 30 rows"):
        d = load_dataset("x", "binary", data_file=path, seed=4, test_fraction=0.2)
    _check_float(d.x_train, (24, 1))
    _check_float(d.x_test, (6, 1))
    assert d.y_train.dtype == np.int64 and d.client_id.dtype == np.int64
    rows = np.concatenate([d.x_train[:, 0], d.x_test[:, 0]]).astype(int)
    assert np.array_equal(np.sort(rows), np.arange(n))
    train_rows = d.x_train[:, 0].astype(int)
    np.testing.assert_array_equal(d.y_train, y[train_rows])
    np.testing.assert_array_equal(d.client_id, cid[train_rows])
    with pytest.warns(DataWarning):
        again = load_dataset("x", "binary", data_file=path, seed=4)
        other = load_dataset("x", "binary", data_file=path, seed=5)
    np.testing.assert_array_equal(d.x_test, again.x_test)
    assert not np.array_equal(d.x_test, other.x_test)


def test_npz_gaussian_mean_needs_only_x(tmp_path):
    path = _write(tmp_path, x_train=np.ones((10, 2)), x_test=np.zeros((3, 2)))
    d = load_dataset("synthetic", "none", data_file=path)
    assert d.y_train is None and d.y_test is None
    assert d.x_test.shape == (3, 2)


def test_npz_holdout_is_reported(tmp_path):
    rng = np.random.default_rng(0)
    path = _write(tmp_path, x_train=rng.standard_normal((200, 3)), y_train=rng.standard_normal(200))
    with pytest.warns(DataWarning) as record:
        d = load_dataset("synthetic", "real", data_file=path, seed=3, test_fraction=0.2)
    assert [str(w.message) for w in record] == [
        f"data file {path!r} has no x_test: held out 40 of 200 rows (test-fraction 0.2, seed 3) "
        "as the test set"
    ]
    assert d.holdout_rows == 40
    assert d.x_train.shape == (160, 3) and d.x_test.shape == (40, 3)
    # Without targets too.
    with pytest.warns(DataWarning, match="held out 50 of 200 rows .test-fraction 0.25, seed 0."):
        g = load_dataset("synthetic", "none", data_file=path, test_fraction=0.25)
    assert g.holdout_rows == 50 and g.y_test is None
    # Positional 6-field view is unchanged; the count is the 7th field.
    assert d[6] == d.holdout_rows and len(d) == 7


def test_npz_with_x_test_holds_nothing_out(tmp_path):
    path = _write(tmp_path, x_train=np.ones((10, 2)), x_test=np.zeros((3, 2)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        d = load_dataset("synthetic", "none", data_file=path)
    assert d.holdout_rows == 0 and d.x_train.shape == (10, 2)


_X = np.zeros((6, 2))
_Y01 = np.array([0, 1, 0, 1, 0, 1])


@pytest.mark.parametrize(
    ("model", "arrays", "needle"),
    [
        ("gaussian-mean", {"y_train": _Y01}, "x_train"),
        ("linear-regression", {"x_train": _X}, "y_train"),
        ("logistic-regression", {"x_train": _X}, "y_train"),
        ("linear-regression", {"x_train": _X, "y_train": np.zeros(5)}, "y_train"),
        ("linear-regression", {"x_train": _X, "y_train": np.zeros(6), "x_test": _X}, "x_test"),
        ("linear-regression", {"x_train": _X, "y_train": np.zeros(6), "y_test": _Y01}, "y_test"),
        (
            "linear-regression",
            {
                "x_train": _X,
                "y_train": np.zeros(6),
                "x_test": np.zeros((2, 3)),
                "y_test": np.zeros(2),
            },
            "x_test.*3 features",
        ),
        ("gaussian-mean", {"x_train": np.array([[1.0, np.nan]] * 3)}, "non-finite"),
        (
            "linear-regression",
            {"x_train": _X, "y_train": np.array([0, 1, np.inf, 0, 0, 0])},
            "y_train.*non-finite",
        ),
        (
            "logistic-regression",
            {"x_train": _X, "y_train": np.array([0, 1, 2, 3, 2, 1])},
            r"labels must be 0 or 1, found \[2, 3\]",
        ),
        (
            "bnn-classifier",
            {"x_train": _X, "y_train": np.array([0, 1, -2, 3, 2.5, -2])},
            r"y_train' labels must be integers in \[0, 100000\) \(class indices\), found \[-2, 2.5\]",
        ),
        (
            "bnn-classifier",
            {"x_train": _X, "y_train": np.arange(6), "x_test": _X, "y_test": np.full(6, 0.5)},
            r"y_test' labels must be integers in \[0, 100000\) \(class indices\), found \[0.5\]",
        ),
        ("bnn-classifier", {"x_train": _X}, "y_train' is required: this model needs class labels"),
        ("bnn-regression", {"x_train": _X}, "y_train' is required: this model needs real-valued targets"),
        ("gaussian-mean", {"x_train": _X, "client_id": np.arange(5)}, "client_id"),
        (
            "gaussian-mean",
            {"x_train": _X, "client_id": np.array([0, 1, 2, -1, 0, 0])},
            "client_id.*>= 0",
        ),
        (
            "gaussian-mean",
            {"x_train": _X, "client_id": np.linspace(0, 1, 6)},
            "client_id.*integers",
        ),
    ],
)
def test_npz_errors(tmp_path, model, arrays, needle):
    path = _write(tmp_path, **arrays)
    with pytest.raises(DataError, match=needle) as info:
        _load("synthetic", model, data_file=path)
    assert "data.npz" in str(info.value)
    assert "\n" not in str(info.value)


def test_npz_bnn_models(tmp_path):
    y = np.array([0, 4, 2, 2, 7, 1], dtype=np.float32)  # integer-valued floats are fine
    path = _write(tmp_path, x_train=_X, y_train=y, x_test=_X[:2], y_test=np.array([3, 0]))
    d = load_dataset("synthetic", "multiclass", data_file=path)
    assert d.y_train.dtype == np.int64 and d.y_test.dtype == np.int64
    np.testing.assert_array_equal(d.y_train, [0, 4, 2, 2, 7, 1])
    r = load_dataset("synthetic", "real", data_file=path)
    assert r.y_train.dtype == np.float64
    np.testing.assert_array_equal(r.y_train, y)


def test_npz_missing_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("synthetic", "none", data_file=str(tmp_path / "nope.npz"))


# ------------------------------------------------------------------------ partitions


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "pathological"])
def test_partition_cover_and_determinism(cancer, scheme):
    n = cancer.x_train.shape[0]
    parts = partition_indices(cancer, 10, scheme, seed=3)
    _check_cover(parts, n, 10)
    assert _same(parts, partition_indices(cancer, 10, scheme, seed=3))
    if scheme != "pathological":  # pathological with 2 labels x 2 per client is seed-free
        assert not _same(parts, partition_indices(cancer, 10, scheme, seed=4))


def test_iid_is_balanced(cancer):
    sizes = [p.size for p in partition_indices(cancer, 10, "iid")]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("seed", range(5))
def test_dirichlet_small_alpha_works_and_is_skewed(cancer, seed):
    n = cancer.x_train.shape[0]
    skewed = partition_indices(cancer, 10, "dirichlet", alpha=0.1, seed=seed)
    _check_cover(skewed, n, 10)
    iid = partition_indices(cancer, 10, "iid", seed=seed)
    assert _mean_tv(cancer.y_train, skewed) > _mean_tv(cancer.y_train, iid) + 0.1


def test_dirichlet_impossible_alpha(cancer):
    with pytest.raises(DataError, match="larger alpha or fewer clients"):
        partition_indices(cancer, 10, "dirichlet", alpha=1e-4)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("scheme", ["dirichlet", "pathological"])
def test_label_schemes_on_continuous_data(model, scheme):
    d = _load("synthetic", model, synthetic_size=125, seed=2)
    parts = partition_indices(d, 5, scheme, seed=1)
    _check_cover(parts, 100, 5)


def test_pathological_classes_per_client():
    d = load_dataset("synthetic", "real", synthetic="linear", synthetic_size=250)
    parts = partition_indices(d, 10, "pathological", classes_per_client=2, seed=0)
    _check_cover(parts, 200, 10)
    # Quantile bins of y: each client holds rows of at most 2 bins (2 contiguous ranges
    # of y at most, so its y values span at most 2 of the 10 deciles).
    edges = np.quantile(d.y_train, np.linspace(0, 1, 11)[1:-1])
    for p in parts:
        assert np.unique(np.searchsorted(edges, d.y_train[p], side="right")).size <= 2


def test_pathological_one_class_each(cancer):
    parts = partition_indices(cancer, 4, "pathological", classes_per_client=1)
    _check_cover(parts, cancer.x_train.shape[0], 4)
    assert all(np.unique(cancer.y_train[p]).size == 1 for p in parts)


def test_pathological_errors(cancer):
    with pytest.raises(DataError, match="exceeds the number of distinct labels"):
        partition_indices(cancer, 4, "pathological", classes_per_client=3)
    with pytest.raises(DataError, match="unassigned"):
        partition_indices(cancer, 1, "pathological", classes_per_client=1)


@pytest.mark.parametrize("num_clients", [10, 20, 100])
@pytest.mark.parametrize("seed", [0, 7])
def test_pathological_digits_two_classes_per_client(digits, num_clients, seed):
    """McMahan et al.'s non-IID split: every client holds exactly 2 digits, all rows used."""
    n = digits.x_train.shape[0]
    parts = partition_indices(digits, num_clients, "pathological", classes_per_client=2, seed=seed)
    _check_cover(parts, n, num_clients)  # non-empty, sorted, every row exactly once
    for p in parts:
        assert np.unique(digits.y_train[p]).size == 2
    assert _same(parts, partition_indices(digits, num_clients, "pathological", seed=seed))
    if num_clients == 100:
        assert min(p.size for p in parts) >= 5 and sum(p.size for p in parts) == 1437


def test_pathological_digits_impossible(digits):
    with pytest.raises(DataError, match="impossible"):
        partition_indices(digits, 1000, "pathological", classes_per_client=2)
    with pytest.raises(DataError, match="exceeds the number of distinct labels \\(10\\)"):
        partition_indices(digits, 10, "pathological", classes_per_client=11)


def test_natural(tmp_path):
    cid = np.array([9, 2, 2, 5, 9, 9, 5, 2, 2, 9])
    path = _write(tmp_path, x_train=np.arange(10.0), x_test=np.zeros(2), client_id=cid)
    d = load_dataset("synthetic", "none", data_file=path)
    parts = partition_indices(d, 3, "natural")
    _check_cover(parts, 10, 3)
    for k, natural in enumerate([2, 5, 9]):  # sorted ids -> clients 0..2
        np.testing.assert_array_equal(parts[k], np.flatnonzero(cid == natural))
    with pytest.raises(DataError, match="3 distinct client ids.*4"):
        partition_indices(d, 4, "natural")


def test_natural_needs_client_id(cancer):
    with pytest.raises(DataError, match="needs a client_id"):
        partition_indices(cancer, 2, "natural")


def test_partition_errors(cancer):
    with pytest.raises(DataError, match="cannot split 455 training rows over 456 clients"):
        partition_indices(cancer, 456, "iid")
    with pytest.raises(DataError, match="at least 1"):
        partition_indices(cancer, 0, "iid")
    with pytest.raises(DataError, match="iid, dirichlet, pathological, natural"):
        partition_indices(cancer, 2, "shards")


def test_single_client(cancer):
    for scheme in ("iid", "dirichlet"):
        _check_cover(partition_indices(cancer, 1, scheme), cancer.x_train.shape[0], 1)


def test_labels_and_ids_that_would_wrap_are_refused(tmp_path):
    """A class label of 1e20 (multiclass) and a uint64 client id of 2**63 + 5 would wrap when
    cast to int64 (INT64_MIN, a negative id): refused in one line (issue 32, row 5)."""
    x = np.ones((10, 2))
    y = np.zeros(10)
    y[3] = 1e20
    path = _write(tmp_path, x_train=x, y_train=y, x_test=x, y_test=np.zeros(10))
    with pytest.raises(DataError, match=r"labels must be integers in \[0, 100000\).*1000000"):
        load_dataset("x", "multiclass", data_file=path, seed=0)
    cid = np.zeros(10, dtype=np.uint64)
    cid[0] = np.uint64(2**63 + 5)
    path = _write(tmp_path, x_train=x, y_train=np.zeros(10), x_test=x, y_test=np.zeros(10),
                  client_id=cid)
    with pytest.raises(DataError, match=r"'client_id' must fit in int64.*9223372036854775813"):
        load_dataset("x", "binary", data_file=path, seed=0)


def test_values_whose_products_overflow_are_refused(tmp_path):
    """Features times 1e200 (and a real target of 1e200) overflow the solvers' x_i x_j sums:
    refused in one line with the limit and what to do (issue 32, row 4)."""
    x = np.random.default_rng(0).normal(size=(10, 2))
    path = _write(tmp_path, x_train=x * 1e200, y_train=np.zeros(10))
    with pytest.raises(DataError, match=r"'x_train' has a value of magnitude .*e\+200, above "
                                        r"1e\+50.*rescale"):
        load_dataset("x", "binary", data_file=path, seed=0)
    path = _write(tmp_path, x_train=x, y_train=np.full(10, 1e200))
    with pytest.raises(DataError, match=r"'y_train' has a value of magnitude"):
        load_dataset("x", "real", data_file=path, seed=0)
    path = _write(tmp_path, x_train=x / np.abs(x).max() * 1e50, y_train=np.zeros(10))  # at the limit
    with pytest.warns(DataWarning):
        load_dataset("x", "binary", data_file=path, seed=0)


@pytest.mark.parametrize("scale", [1e300, 1e-300, 1e101, 1e-101])
def test_prior_scales_float64_cannot_carry_are_refused(scale):
    from fedbayes_flwr.runtime.config import ConfigError, parse_run_config

    with pytest.raises(ConfigError, match=r"prior-scale.*outside \[1e-100, 1e\+100\]"):
        parse_run_config({"prior-scale": scale})
    parse_run_config({"prior-scale": 1e100})
