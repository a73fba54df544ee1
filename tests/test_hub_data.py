"""Hub datasets (``load_dataset("hub:<id>")``) through ``flwr_datasets.FederatedDataset``.

Nothing here touches the network: the datasets are tiny MNIST-like parquet files written
with the Hugging Face ``datasets`` library and read back with the ``"parquet"`` builder
through exactly the code path used for ``hub:mnist``. Hub offline mode is switched on and
every internet socket connection fails, so an attempted download would show up as an error.
"""

from __future__ import annotations

import socket
import warnings

import numpy as np
import pytest

from fedbayes_flwr.data import DataError, DataWarning, load_dataset, partition_indices

N_TRAIN, N_TEST, SIDE = 60, 20, 8


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Offline mode for datasets / huggingface_hub / flwr-datasets telemetry, and no sockets."""
    import datasets
    import huggingface_hub.constants
    from flwr_datasets.common import telemetry

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    # The libraries read these at import time, so patch the module constants too.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(telemetry, "FLWR_TELEMETRY_ENABLED", "0")

    attempts: list = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guard(real):
        def connect(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                attempts.append(address)
                raise OSError(f"network disabled in tests (connect to {address!r})")
            return real(sock, address)

        return connect

    monkeypatch.setattr(socket.socket, "connect", guard(real_connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guard(real_connect_ex))
    yield attempts
    assert attempts == [], f"network connections attempted: {attempts}"


def _images(rng, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, SIDE, SIDE), dtype=np.uint8)


def _labels(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) % 10


@pytest.fixture(scope="module")
def mnist_like(tmp_path_factory):
    """Train/test parquet files of 8x8 uint8 PIL images with ClassLabel labels 0..9."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("mnist_like")
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(i) for i in range(10)])}
    )
    raw = {}
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        x, y = _images(rng, n), _labels(n)
        x[:, 0, 0], x[:, 0, 1] = 0, 255  # full range present in every split
        ds = datasets.Dataset.from_dict(
            {"image": [Image.fromarray(img, mode="L") for img in x], "label": y.tolist()},
            features=features,
        )
        ds.to_parquet(str(root / f"{split}.parquet"))
        raw[split] = (x, y)
    files = {split: str(root / f"{split}.parquet") for split in ("train", "test")}
    return files, raw


def _hub_kwargs(data_files, tmp_path) -> dict:
    return {"data_files": data_files, "cache_dir": str(tmp_path / "hf-cache")}


def test_local_parquet_through_federated_dataset(mnist_like, tmp_path, monkeypatch):
    import flwr_datasets

    files, raw = mnist_like
    calls = []
    real = flwr_datasets.FederatedDataset

    def spy(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(flwr_datasets, "FederatedDataset", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # nothing held out: no warning
        d = load_dataset("hub:parquet", "multiclass", hub_kwargs=_hub_kwargs(files, tmp_path))

    # Loaded through FederatedDataset with a single train partition, kwargs passed on.
    assert len(calls) == 1
    call = calls[0]
    assert call["dataset"] == "parquet"
    assert set(call["partitioners"]) == {"train"}
    assert call["partitioners"]["train"].num_partitions == 1
    assert call["data_files"] == files

    assert d.name == "hub:parquet" and d.client_id is None
    assert d.holdout_rows == 0  # the dataset has a test split
    for x, n in ((d.x_train, N_TRAIN), (d.x_test, N_TEST)):
        assert x.dtype == np.float64 and x.flags.c_contiguous
        assert x.shape == (n, SIDE * SIDE)
        assert x.min() == 0.0 and x.max() == 1.0
    for y, n in ((d.y_train, N_TRAIN), (d.y_test, N_TEST)):
        assert y.dtype == np.int64 and y.shape == (n,)
    # Source order is kept (no shuffling): rows equal the written images / 255.
    x_tr, y_tr = raw["train"]
    x_te, y_te = raw["test"]
    np.testing.assert_array_equal(d.x_train, x_tr.reshape(N_TRAIN, -1) / 255.0)
    np.testing.assert_array_equal(d.x_test, x_te.reshape(N_TEST, -1) / 255.0)
    np.testing.assert_array_equal(d.y_train, y_tr)
    np.testing.assert_array_equal(d.y_test, y_te)

    # The partition schemes work on it.
    for scheme, k in (("iid", 6), ("dirichlet", 4), ("pathological", 10)):
        parts = partition_indices(d, k, scheme, classes_per_client=2, seed=0)
        assert len(parts) == k and all(p.size > 0 for p in parts)
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(N_TRAIN))
        if scheme == "pathological":
            assert all(np.unique(d.y_train[p]).size == 2 for p in parts)


def test_other_targets(mnist_like, tmp_path):
    files, raw = mnist_like
    kwargs = _hub_kwargs(files, tmp_path)
    r = load_dataset("hub:parquet", "real", hub_kwargs=kwargs)
    assert r.y_train.dtype == np.float64
    np.testing.assert_array_equal(r.y_train, raw["train"][1])
    g = load_dataset("hub:parquet", "none", hub_kwargs=kwargs)
    assert g.y_train is None and g.y_test is None and g.x_train.shape == (N_TRAIN, 64)
    with pytest.raises(DataError, match=r"labels must be 0 or 1, found \[2, 3, 4"):
        load_dataset("hub:parquet", "binary", hub_kwargs=kwargs)


def test_no_test_split_holds_out_a_fixed_fraction(mnist_like, tmp_path):
    files, raw = mnist_like
    kwargs = _hub_kwargs({"train": files["train"]}, tmp_path)
    with pytest.warns(DataWarning) as record:
        d = load_dataset("hub:parquet", "multiclass", test_fraction=0.25, hub_kwargs=kwargs)
    assert [str(w.message) for w in record] == [
        "hub dataset 'parquet' has no 'test' split: held out 15 of 60 rows "
        "(test-fraction 0.25) as the test set"
    ]
    assert d.x_train.shape == (45, 64) and d.x_test.shape == (15, 64)
    assert d.holdout_rows == 15
    rows = np.concatenate([d.x_train, d.x_test])
    expected = raw["train"][0].reshape(N_TRAIN, -1) / 255.0
    assert np.array_equal(np.unique(rows, axis=0), np.unique(expected, axis=0))
    with pytest.warns(DataWarning, match="held out 15 of 60 rows"):
        again = load_dataset(
            "hub:parquet", "multiclass", seed=5, test_fraction=0.25, hub_kwargs=kwargs
        )
    np.testing.assert_array_equal(d.x_test, again.x_test)  # fixed split, independent of seed
    np.testing.assert_array_equal(d.y_test, again.y_test)


def test_nested_list_pixels_and_custom_columns(tmp_path):
    import datasets

    rng = np.random.default_rng(1)
    x = _images(rng, 12).astype(np.int64)
    x[0, 0, 0], x[0, 0, 1] = 0, 255
    y = _labels(12)
    path = str(tmp_path / "pixels.parquet")
    datasets.Dataset.from_dict({"pixels": x.tolist(), "labels": y.tolist()}).to_parquet(path)
    kwargs = _hub_kwargs({"train": path, "test": path}, tmp_path)
    d = load_dataset("hub:parquet", "multiclass", hub_kwargs=kwargs)  # auto-detected names
    np.testing.assert_array_equal(d.x_train, x.reshape(12, -1) / 255.0)
    np.testing.assert_array_equal(d.y_train, y)

    other = str(tmp_path / "custom.parquet")
    datasets.Dataset.from_dict(
        {"pic": x.tolist(), "digit": y.tolist(), "f0": np.linspace(-3, 3, 12).tolist()}
    ).to_parquet(other)
    kwargs = _hub_kwargs({"train": other, "test": other}, tmp_path)
    c = load_dataset(
        "hub:parquet",
        "multiclass",
        hub_kwargs=kwargs,
        hub_feature_column="pic",
        hub_label_column="digit",
    )
    # "pic" is no known image name and not an Image feature: not rescaled.
    np.testing.assert_array_equal(c.x_train, x.reshape(12, -1).astype(np.float64))
    np.testing.assert_array_equal(c.y_train, y)
    # Tabular: every numeric column except the label, unscaled.
    t = load_dataset("hub:parquet", "real", hub_kwargs=kwargs, hub_label_column="digit")
    np.testing.assert_allclose(t.x_train[:, 0], np.linspace(-3, 3, 12))
    assert t.x_train.shape == (12, 1)
    with pytest.raises(DataError, match="no label column.*pass hub_label_column"):
        load_dataset("hub:parquet", "multiclass", hub_kwargs=kwargs)
    with pytest.raises(DataError, match="no feature column 'nope'"):
        load_dataset(
            "hub:parquet",
            "multiclass",
            hub_kwargs=kwargs,
            hub_feature_column="nope",
            hub_label_column="digit",
        )


def test_failing_load_is_a_one_line_data_error(tmp_path):
    missing = str(tmp_path / "does-not-exist.parquet")
    with pytest.raises(DataError) as info:
        load_dataset(
            "hub:parquet", "multiclass", hub_kwargs=_hub_kwargs({"train": missing}, tmp_path)
        )
    msg = str(info.value)
    assert msg.startswith("could not load hub dataset 'parquet': ")
    assert msg.endswith("; no network? use an embedded dataset or --data FILE.npz")
    assert "\n" not in msg


def test_unreachable_hub_dataset_is_a_data_error(tmp_path):
    """Offline, an id that is not in the local cache fails like a network failure."""
    with pytest.raises(DataError, match=r"could not load hub dataset 'nobody/no-such-set': .*no network\?"):
        load_dataset(
            "hub:nobody/no-such-set", "multiclass", hub_kwargs={"cache_dir": str(tmp_path)}
        )


@pytest.mark.parametrize(
    ("name", "kwargs", "needle"),
    [
        ("hub:", None, "empty hub dataset name"),
        ("hub:parquet", {"partitioners": {"train": 2}}, "must not set partitioners"),
        ("hub:parquet", {"dataset": "x", "preprocessor": None}, "must not set dataset, preprocessor"),
    ],
)
def test_bad_hub_arguments(name, kwargs, needle):
    with pytest.raises(DataError, match=needle):
        load_dataset(name, "multiclass", hub_kwargs=kwargs)
