"""Hub datasets (``load_dataset("hub:<id>")``) through ``flwr_datasets.FederatedDataset``.

Nothing here touches the network: the datasets are tiny MNIST-like parquet files written
with the Hugging Face ``datasets`` library and read back with the ``"parquet"`` builder
through exactly the code path used for ``hub:mnist``. Hub offline mode is switched on and
every internet socket connection fails, so an attempted download would show up as an error.
"""

from __future__ import annotations

import socket
import sys
import warnings
from pathlib import Path

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


# ------------------------------------------------------------------ text corpora (LDA)

TOPICS = (
    ("football", "goal", "team", "match", "player", "score", "league"),
    ("orbit", "rocket", "planet", "launch", "nasa", "moon", "satellite"),
    ("software", "windows", "driver", "disk", "memory", "program", "compiler"),
)
STOP = ("the", "and", "of", "is", "it", "was", "we", "they", "this", "about")
N_DOCS_TRAIN, N_DOCS_TEST = 60, 20


def _documents(rng, n: int) -> list[str]:
    """Short fake documents: topic words and stop words, capitals, digits, punctuation."""
    docs = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        words = list(rng.choice(topic, size=6)) + list(rng.choice(STOP, size=4)) + ["42", "x"]
        rng.shuffle(words)
        words[0] = words[0].capitalize()
        docs.append(" ".join(words) + ". (re: 2024!)")
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Train/test parquet files of a 20-newsgroups-like corpus (text, label, label_text).

    Training documents 3 (empty), 7 (missing) and 11 (stop words and numbers only) and
    test documents 5 (only words absent from training) and 9 (empty) have no vocabulary
    word. Test document 0 also holds a word that is not in the training vocabulary.
    """
    import datasets

    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("corpus")
    docs = {"train": _documents(rng, N_DOCS_TRAIN), "test": _documents(rng, N_DOCS_TEST)}
    docs["train"][3], docs["train"][7], docs["train"][11] = "", None, "The and OF it, 1999 - 2000."
    docs["test"][0] += " zebra"
    docs["test"][5], docs["test"][9] = "Zebra quokka aardvark!", "   "
    files = {}
    for split, text in docs.items():
        labels = [i % len(TOPICS) for i in range(len(text))]
        names = [("sport", "space", "computers")[k] for k in labels]
        ds = datasets.Dataset.from_dict(
            {"text": text, "label": labels, "label_text": names},
            features=datasets.Features(
                {
                    "text": datasets.Value("string"),
                    "label": datasets.Value("int64"),
                    "label_text": datasets.Value("string"),
                }
            ),
        )
        files[split] = str(root / f"{split}.parquet")
        ds.to_parquet(files[split])
    return files, docs


def _word_counts(doc: str, vocabulary: list[str]) -> list[int]:
    """Reference counts: lower-cased runs of letters (at least two) per vocabulary word."""
    import re

    tokens = re.findall(r"[a-z]{2,}", (doc or "").lower())
    return [tokens.count(w) for w in vocabulary]


def test_vectorise_text_counts_training_vocabulary_without_stop_words(corpus):
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    from fedbayes_flwr.data.text import vectorise_text

    _, docs = corpus
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scikit-learn's stop-word consistency check is quiet
        x_train, x_test, vocabulary = vectorise_text(docs["train"], docs["test"], stem=False)
    # The vocabulary: every topic word, sorted; no stop word, number, letter or test-only word.
    assert vocabulary == sorted(w for topic in TOPICS for w in topic)
    assert not set(vocabulary) & (ENGLISH_STOP_WORDS | {"re", "x", "zebra", "quokka"})
    # Non-negative integer counts, float64, one column per word.
    for x in (x_train, x_test):
        assert x.dtype == np.float64 and x.flags.c_contiguous
        assert x.shape[1] == len(vocabulary)
        assert x.min() >= 0 and np.array_equal(x, np.round(x))
        assert (x.sum(axis=1) == 6).all()  # the six topic words of each document
    # Empty documents dropped, order kept; the counts are the reference counts.
    kept_train = [d for i, d in enumerate(docs["train"]) if i not in (3, 7, 11)]
    kept_test = [d for i, d in enumerate(docs["test"]) if i not in (5, 9)]
    assert x_train.shape[0] == N_DOCS_TRAIN - 3 and x_test.shape[0] == N_DOCS_TEST - 2
    np.testing.assert_array_equal(x_train, [_word_counts(d, vocabulary) for d in kept_train])
    np.testing.assert_array_equal(x_test, [_word_counts(d, vocabulary) for d in kept_test])

    # Test documents never change the vocabulary; a test-only word is ignored.
    _, x_other, vocabulary_other = vectorise_text(docs["train"], ["zebra goal goal"], stem=False)
    assert vocabulary_other == vocabulary
    np.testing.assert_array_equal(x_other, [_word_counts("goal goal", vocabulary)])


def test_vectorise_text_vocabulary_cap_and_errors(corpus):
    from fedbayes_flwr.data.text import TEXT_MAX_FEATURES, vectorise_text

    _, docs = corpus
    assert TEXT_MAX_FEATURES == 2000
    full, _, vocabulary = vectorise_text(docs["train"], docs["test"], stem=False)
    totals = dict(zip(vocabulary, full.sum(axis=0), strict=True))
    x_train, x_test, top = vectorise_text(docs["train"], docs["test"], max_features=5, stem=False)
    assert len(top) == 5 and x_train.shape[1] == x_test.shape[1] == 5
    assert top == sorted(top)
    assert min(totals[w] for w in top) >= max(totals[w] for w in vocabulary if w not in top)
    # Documents left without a kept word are dropped too.
    assert (x_train.sum(axis=1) > 0).all() and (x_test.sum(axis=1) > 0).all()
    one, _, word = vectorise_text(["cat cat dog", "dog", "bird"], ["cat"], max_features=1, stem=False)
    assert word == ["cat"] and one.tolist() == [[2.0]]
    _, _, every = vectorise_text(docs["train"], docs["test"], max_features=None, stem=False)
    assert every == vocabulary

    for bad in (0, -3, 2.5, True, "10"):
        with pytest.raises(DataError, match="max_features must be a positive integer or None"):
            vectorise_text(docs["train"], docs["test"], max_features=bad)
    with pytest.raises(DataError, match="no word left in the training documents"):
        vectorise_text(["The and of it", "", None, "12 34"], ["goal"], stem=False)
    with pytest.raises(DataError, match="every one of the 2 test documents is empty"):
        vectorise_text(docs["train"], ["zebra", ""], stem=False)
    with pytest.raises(DataError, match="test document 1 is not text \\(got int\\)"):
        vectorise_text(docs["train"], ["goal", 7], stem=False)
    with pytest.raises(DataError, match="one string"):
        vectorise_text("goal team", ["goal"], stem=False)
    with pytest.raises(DataError, match="no test documents"):
        vectorise_text(docs["train"], [], stem=False)


def test_vectorise_text_stems_only_with_nltk(monkeypatch):
    import sys
    import types

    from fedbayes_flwr.data.text import vectorise_text

    train, test = ["Players played the playing field", "fields"], ["players played"]
    monkeypatch.setitem(sys.modules, "nltk.stem", None)  # NLTK missing: import fails
    _, _, plain = vectorise_text(train, test)
    assert plain == ["field", "fields", "played", "players", "playing"]
    assert vectorise_text(train, test, stem=False)[2] == plain
    with pytest.raises(DataError, match="stemming needs NLTK"):
        vectorise_text(train, test, stem=True)

    class PorterStemmer:  # a stand-in with NLTK's interface (strips a few suffixes)
        def stem(self, word: str) -> str:
            for suffix in ("ing", "ed", "s"):
                if word.endswith(suffix):
                    return word[: -len(suffix)]
            return word

    fake = types.ModuleType("nltk.stem")
    fake.PorterStemmer = PorterStemmer
    monkeypatch.setitem(sys.modules, "nltk", types.ModuleType("nltk"))
    monkeypatch.setitem(sys.modules, "nltk.stem", fake)
    for stem in (None, True):
        x_train, x_test, stems = vectorise_text(train, test, stem=stem)
        assert stems == ["field", "play", "player"]
        np.testing.assert_array_equal(x_train, [[1, 2, 1], [1, 0, 0]])
        np.testing.assert_array_equal(x_test, [[0, 1, 1]])
    assert vectorise_text(train, test, stem=False)[2] == plain


def test_hub_text_column_gives_lda_word_counts(corpus, tmp_path):
    from fedbayes_flwr.data.hub import load_hub_text
    from fedbayes_flwr.data.text import vectorise_text
    from fedbayes_flwr.models.registry import model_spec
    from fedbayes_flwr.models.structured import LDAModel

    files, docs = corpus
    kwargs = _hub_kwargs(files, tmp_path)
    assert model_spec("lda").target == "none"
    dropped = (
        "hub dataset 'parquet': dropped 3 of 60 training documents and 2 of 20 test documents "
        "with no vocabulary word (empty, or only stop words, numbers or rare words)"
    )
    with pytest.warns(DataWarning) as record:
        d = load_dataset("hub:parquet", "none", hub_kwargs=kwargs)
    assert [str(w.message) for w in record] == [dropped]
    assert record[0].filename == __file__  # points at the caller of load_dataset
    x_train, x_test, vocabulary = vectorise_text(docs["train"], docs["test"])
    assert d.name == "hub:parquet" and d.holdout_rows == 0 and d.client_id is None
    assert d.y_train is None and d.y_test is None  # labels ignored
    np.testing.assert_array_equal(d.x_train, x_train)
    np.testing.assert_array_equal(d.x_test, x_test)
    assert d.x_train.shape == (N_DOCS_TRAIN - 3, len(vocabulary))
    assert d.x_train.dtype == np.float64 and d.x_train.flags.c_contiguous
    lda = LDAModel()
    assert lda.check_data(d.x_train) is None and lda.check_data(d.x_test) is None
    parts = partition_indices(d, 3, "iid", seed=0)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(d.x_train.shape[0]))

    # The vocabulary, with the same counts; the cap through load_dataset.
    with pytest.warns(DataWarning, match="dropped 3 of 60") as record:
        same, words = load_hub_text("hub:parquet", hub_kwargs=kwargs)
    assert record[0].filename == __file__
    assert words == vocabulary
    np.testing.assert_array_equal(same.x_train, d.x_train)
    with pytest.warns(DataWarning, match="dropped"):
        capped = load_dataset("hub:parquet", "none", hub_kwargs=kwargs, hub_max_features=4)
    with pytest.warns(DataWarning, match="dropped"):
        _, small = load_hub_text("hub:parquet", hub_kwargs=kwargs, max_features=4)
    assert capped.x_train.shape[1] == capped.x_test.shape[1] == len(small) == 4
    assert set(small) < set(vocabulary)
    assert (capped.x_train.sum(axis=1) > 0).all()

    # An explicitly named text column (the string labels here): one document per label.
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # no empty document
        t = load_dataset("hub:parquet", "none", hub_kwargs=kwargs, hub_feature_column="label_text")
    assert t.x_train.shape == (N_DOCS_TRAIN, 3) and t.x_train.sum() == N_DOCS_TRAIN
    # Only a text column with target "none" gives word counts.
    n = load_dataset("hub:parquet", "none", hub_kwargs=kwargs, hub_feature_column="label")
    assert n.x_train.shape == (N_DOCS_TRAIN, 1)
    with pytest.raises(DataError, match="feature column\\(s\\) label hold no text"):
        load_hub_text("hub:parquet", hub_kwargs=kwargs, feature_column="label")


def test_hub_text_without_test_split_fits_vocabulary_on_training_part(corpus, tmp_path):
    from fedbayes_flwr.data.hub import load_hub_text
    from fedbayes_flwr.data.text import vectorise_text

    files, docs = corpus
    kwargs = _hub_kwargs({"train": files["train"]}, tmp_path)
    with pytest.warns(DataWarning) as record:
        d, vocabulary = load_hub_text("hub:parquet", test_fraction=0.25, hub_kwargs=kwargs)
    messages = [str(w.message) for w in record]
    assert messages[0].startswith("hub dataset 'parquet': dropped 3 of 45 training documents")
    assert messages[1] == (
        "hub dataset 'parquet' has no 'test' split: held out 15 of 60 rows "
        "(test-fraction 0.25) as the test set"
    )
    assert d.holdout_rows == 15
    perm = np.random.default_rng(0).permutation(N_DOCS_TRAIN)
    train = [docs["train"][i] for i in np.sort(perm[15:])]
    test = [docs["train"][i] for i in np.sort(perm[:15])]
    x_train, x_test, expected = vectorise_text(train, test)
    assert vocabulary == expected
    np.testing.assert_array_equal(d.x_train, x_train)
    np.testing.assert_array_equal(d.x_test, x_test)
    assert d.x_train.shape[0] + d.x_test.shape[0] == N_DOCS_TRAIN - 3


@pytest.mark.parametrize("target", ["real", "binary", "multiclass"])
def test_hub_text_column_needs_target_none(corpus, tmp_path, target):
    files, _ = corpus
    kwargs = _hub_kwargs(files, tmp_path)
    for column in (None, "text", "label_text"):
        with pytest.raises(
            DataError,
            match=r"hub dataset 'parquet': feature column '(text|label_text)' holds text, which "
            r"becomes word counts only for a model without targets \(target 'none', e.g. lda\); "
            r"this model needs ",
        ):
            load_dataset("hub:parquet", target, hub_kwargs=kwargs, hub_feature_column=column)


def test_hub_text_column_must_be_alone(corpus, tmp_path):
    files, _ = corpus
    with pytest.raises(DataError, match="text column 'text' must be the only feature column"):
        load_dataset(
            "hub:parquet",
            "none",
            hub_kwargs=_hub_kwargs(files, tmp_path),
            hub_feature_column=["label", "text"],
        )


# ------------------------------------------- the DSVGD paper's hub commands (benchmarks/README.md)

ROOT = Path(__file__).resolve().parents[2]
COVERTYPE_ID, COVERTYPE_SUBSET = "inria-soda/tabular-benchmark", "clf_cat_covertype"
FASHION_ID = "zalando-datasets/fashion_mnist"
# The real columns: the 54 UCI Covertype features and the binary "class" (values 1 and 2) of
# Grinsztajn et al.'s clf_cat_covertype; Fashion-MNIST's image / ClassLabel label.
COVERTYPE_FEATURES = (
    "Elevation", "Aspect", "Slope", "Horizontal_Distance_To_Hydrology",
    "Vertical_Distance_To_Hydrology", "Horizontal_Distance_To_Roadways", "Hillshade_9am",
    "Hillshade_Noon", "Hillshade_3pm", "Horizontal_Distance_To_Fire_Points",
    *(f"Wilderness_Area{i}" for i in range(1, 5)), *(f"Soil_Type{i}" for i in range(1, 41)),
)
FASHION_CLASSES = ("T - shirt / top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                   "Sneaker", "Bag", "Ankle boot")
N_COVERTYPE, N_FASHION_TRAIN, N_FASHION_TEST, FASHION_SIDE = 200, 40, 20, 28


def _hub_commands() -> list[list[str]]:
    """The ``run_simulation.py`` commands with a ``hub:`` dataset in benchmarks/README.md's bash
    blocks (its arguments; tests/docs/test_doc_commands.py leaves these to this module)."""
    import re
    import shlex

    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if "run_simulation.py" in line and "hub:" in line:
                words = shlex.split(line)
                out.append(words[[w.endswith("run_simulation.py") for w in words].index(True) + 1:])
    return out


HUB_COMMANDS = _hub_commands()


@pytest.fixture(scope="module")
def paper_stand_ins(tmp_path_factory):
    """Local files in the two hub datasets' formats: ``{dataset id: (builder, data_files, raw)}``.

    Covertype: one CSV ``train`` split (the hub configuration has no test split) with the real
    column names; one-hot wilderness areas and soil types, ``class`` 1 or 2 driven by the
    elevation. Fashion-MNIST: parquet ``train`` and ``test`` splits of 28x28 uint8 PIL images and
    a ClassLabel with the real class names.
    """
    import datasets
    import pandas as pd
    from PIL import Image

    rng = np.random.default_rng(3)
    root = tmp_path_factory.mktemp("paper_hub")
    n = N_COVERTYPE
    table = {
        "Elevation": rng.uniform(1860, 3860, n), "Aspect": rng.uniform(0, 360, n),
        "Slope": rng.integers(0, 67, n), "Horizontal_Distance_To_Hydrology": rng.uniform(0, 1400, n),
        "Vertical_Distance_To_Hydrology": rng.uniform(-173, 601, n),
        "Horizontal_Distance_To_Roadways": rng.uniform(0, 7120, n),
        "Hillshade_9am": rng.integers(0, 255, n), "Hillshade_Noon": rng.integers(0, 255, n),
        "Hillshade_3pm": rng.integers(0, 255, n),
        "Horizontal_Distance_To_Fire_Points": rng.uniform(0, 7170, n),
    }
    for prefix, count in (("Wilderness_Area", 4), ("Soil_Type", 40)):
        hot = np.eye(count, dtype=np.int64)[rng.integers(0, count, n)]
        table.update({f"{prefix}{i + 1}": hot[:, i] for i in range(count)})
    table["class"] = np.where(table["Elevation"] + rng.normal(0, 300, n) > 2860, 1, 2)
    frame = pd.DataFrame(table)
    assert tuple(frame.columns[:-1]) == COVERTYPE_FEATURES
    csv = str(root / "covertype.csv")
    frame.to_csv(csv, index=False)

    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=list(FASHION_CLASSES))})
    files, raw = {}, {}
    for split, size in (("train", N_FASHION_TRAIN), ("test", N_FASHION_TEST)):
        images = rng.integers(0, 256, size=(size, FASHION_SIDE, FASHION_SIDE), dtype=np.uint8)
        labels = np.arange(size) % 10
        datasets.Dataset.from_dict(
            {"image": [Image.fromarray(img, mode="L") for img in images], "label": labels.tolist()},
            features=features).to_parquet(str(root / f"{split}.parquet"))
        files[split], raw[split] = str(root / f"{split}.parquet"), (images, labels)
    return {COVERTYPE_ID: ("csv", {"train": csv}, frame), FASHION_ID: ("parquet", files, raw)}


def _redirect_hub(monkeypatch, stand_ins: dict, cache_dir) -> list:
    """``datasets.load_dataset`` (what FederatedDataset calls) reads the stand-in of the hub id
    it is given; an id without one fails the test. Returns the ``(id, configuration)`` calls."""
    import datasets

    real, calls = datasets.load_dataset, []

    def load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        builder, data_files, _ = stand_ins[path]
        return real(builder, data_files=data_files, cache_dir=str(cache_dir), **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def _expected(dataset_id: str, stand_ins: dict):
    """What the command's data path must give: (x_train, y_train, x_test, y_test)."""
    from fedbayes_flwr.data.base import num_test_rows

    _, _, raw = stand_ins[dataset_id]
    if dataset_id == FASHION_ID:
        (x_tr, y_tr), (x_te, y_te) = raw["train"], raw["test"]
        return x_tr.reshape(len(x_tr), -1) / 255.0, y_tr, x_te.reshape(len(x_te), -1) / 255.0, y_te
    x = raw[list(COVERTYPE_FEATURES)].to_numpy(np.float64)
    y = (raw["class"].to_numpy() == 1).astype(np.int64)  # the reference: class 2 -> -1, 1 -> +1
    perm = np.random.default_rng(0).permutation(len(x))  # hub.py's fixed hold-out
    n_test = num_test_rows(len(x), 0.2)
    train, test = np.sort(perm[n_test:]), np.sort(perm[:n_test])
    mean, sd = x[train].mean(axis=0), x[train].std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)  # the one-hot columns are never constant here
    return (x[train] - mean) / sd, y[train], (x[test] - mean) / sd, y[test]


def test_paper_hub_commands_are_shown():
    datasets_used = {argv[argv.index("--dataset") + 1] for argv in HUB_COMMANDS}
    assert datasets_used == {
        f"hub:{COVERTYPE_ID}?subset={COVERTYPE_SUBSET}&label=class&positive=1&scale=standard",
        f"hub:{FASHION_ID}",
    }
    algorithms = {argv[argv.index("--algorithm") + 1] for argv in HUB_COMMANDS}
    assert {"dsvgd", "fedavg-paper", "fedavg"} <= algorithms


@pytest.mark.parametrize("index", range(len(HUB_COMMANDS)))
def test_paper_hub_command_runs_on_stand_in(paper_stand_ins, tmp_path, monkeypatch, index):
    """The exact command: its dataset id, configuration, columns and label coding reach
    FederatedDataset, the arrays are the stand-in's (held out, coded, standardised as stated),
    and one short round runs in-process with the command's model and particles."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import run_simulation
    from fedbayes_flwr.data.hub import parse_hub_name
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.experiment import build_experiment

    argv = HUB_COMMANDS[index]
    calls = _redirect_hub(monkeypatch, paper_stand_ins, tmp_path / "hf-cache")
    config = parse_run_config(run_simulation.build_overrides(run_simulation.parse_args(argv)))
    dataset_id, options = parse_hub_name(config.dataset)
    holdout = dataset_id == COVERTYPE_ID  # the configuration has only a train split
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", DataWarning)
        exp = build_experiment(config)
    held = [str(w.message) for w in record if issubclass(w.category, DataWarning)]
    assert held == ([f"hub dataset {COVERTYPE_ID!r} has no 'test' split: held out 40 of 200 rows "
                     "(test-fraction 0.2) as the test set"] if holdout else [])
    assert calls == [(dataset_id, options.get("subset"))]
    d = exp.dataset
    assert d.name == config.dataset and d.holdout_rows == (40 if holdout else 0)
    assert d.x_train.dtype == d.x_test.dtype == np.float64
    assert d.y_train.dtype == d.y_test.dtype == np.int64
    for got, want in zip((d.x_train, d.y_train, d.x_test, d.y_test),
                         _expected(dataset_id, paper_stand_ins), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)  # the same arithmetic
    if holdout:  # binary labels for the logistic model, both classes present
        assert set(np.unique(d.y_train)) == {0, 1}
        np.testing.assert_allclose(d.x_train.mean(axis=0), 0.0, atol=1e-12)
    assert exp.num_clients == config.num_clients == 2
    assert np.array_equal(np.sort(np.concatenate(exp.partitions)), np.arange(len(d.y_train)))

    # One round of 2 SVGD / Adam steps: the data path is the command's; the run only has to run
    # (the paper's 200 + 200 SVGD steps on a 784-100-10 BNN take minutes on 2 cores).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # the hold-out, checked above
        short = {"dsvgd": "dsvgd.local-iterations=2 dsvgd.distillation-iterations=2",
                 "fedavg": "fedavg.local-steps=2"}[config.bundle_name]  # its own section only
        code = run_simulation.main([*argv, "--quiet", "--num-rounds", "1",
                                    "--output-dir", str(tmp_path / "out"), "--run-config", short])
    assert code == 0
    assert calls[1:] == [(dataset_id, options.get("subset"))]  # the run loads it the same way


def test_hub_name_options_are_checked(mnist_like, tmp_path):
    from fedbayes_flwr.data.hub import parse_hub_name

    name = "hub:org/set?subset=a&label=class&positive=1&scale=standard"
    assert parse_hub_name(name) == (
        "org/set", {"subset": "a", "label": "class", "positive": "1", "scale": "standard"})
    assert parse_hub_name("hub: org/set ") == ("org/set", {})
    for bad, needle in (("hub:?subset=a", "empty hub dataset name"),
                        ("hub:x?subset", "option 'subset' is not key=value"),
                        ("hub:x?color=red", "unknown option 'color'; options: subset, label"),
                        ("hub:x?label=a&label=b", "option 'label' given twice"),
                        ("hub:x?scale=minmax", "unknown scale 'minmax'; scales: standard")):
        with pytest.raises(DataError, match=needle):
            parse_hub_name(bad)

    files, raw = mnist_like
    kwargs = _hub_kwargs(files, tmp_path)
    # One-vs-rest by a ClassLabel's name ("3" is class 3); the other rows are 0.
    d = load_dataset("hub:parquet?positive=3", "binary", hub_kwargs=kwargs)
    np.testing.assert_array_equal(d.y_train, (raw["train"][1] == 3).astype(np.int64))
    np.testing.assert_array_equal(d.y_test, (raw["test"][1] == 3).astype(np.int64))
    with pytest.raises(DataError, match="positive='11' matches no training row's 'label'"):
        load_dataset("hub:parquet?positive=11", "binary", hub_kwargs=kwargs)
    with pytest.raises(DataError, match="positive='x' is not a number, but label column 'label'"):
        load_dataset("hub:parquet?positive=x", "binary", hub_kwargs=kwargs)
    with pytest.raises(DataError, match="reads no label \\(target 'none'\\)"):
        load_dataset("hub:parquet?positive=1", "none", hub_kwargs=kwargs)
    with pytest.raises(DataError, match="sets label='label' but hub_label_column is 'other'"):
        load_dataset("hub:parquet?label=label", "multiclass", hub_kwargs=kwargs,
                     hub_label_column="other")
    with pytest.raises(DataError, match="sets subset='a' but hub_kwargs\\['subset'\\] is 'b'"):
        load_dataset("hub:parquet?subset=a", "multiclass", hub_kwargs={**kwargs, "subset": "b"})
    # scale=standard: the training split's mean and sd (ddof 0) applied to both splits.
    s = load_dataset("hub:parquet?scale=standard", "multiclass", hub_kwargs=kwargs)
    x_tr = raw["train"][0].reshape(N_TRAIN, -1) / 255.0
    x_te = raw["test"][0].reshape(N_TEST, -1) / 255.0
    mean, sd = x_tr.mean(axis=0), x_tr.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)  # columns 0 and 1 are constant (0 and 255): only centred
    np.testing.assert_allclose(s.x_train, (x_tr - mean) / sd, atol=1e-12)
    np.testing.assert_allclose(s.x_test, (x_te - mean) / sd, atol=1e-12)
