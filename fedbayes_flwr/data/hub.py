"""Hugging Face datasets (``"hub:<id>"``) loaded through ``flwr_datasets.FederatedDataset``.

``flwr_datasets`` and ``datasets`` are imported lazily, when a hub dataset is loaded. A text
column (e.g. ``text`` of ``"hub:SetFit/20_newsgroups"``) becomes word counts through
:func:`fedbayes_flwr.data.text.vectorise_text`, for models without targets (LDA).

A hub name may carry options after ``?``, joined by ``&`` (see :func:`parse_hub_name`), so a
dataset whose configuration, label column or label coding differs from the defaults is one
``--dataset`` value, e.g. the DSVGD paper's binary Covertype task::

    hub:inria-soda/tabular-benchmark?subset=clf_cat_covertype&label=class&positive=1&scale=standard
"""

from __future__ import annotations

import warnings

import numpy as np

from fedbayes_flwr.data.base import (
    HUB_PREFIX,
    DataError,
    Dataset,
    DataWarning,
    as_float_array,
    as_x,
    as_y,
    needs,
    num_test_rows,
    one_line,
)
from fedbayes_flwr.data.embedded import standardise
from fedbayes_flwr.data.text import TEXT_MAX_FEATURES, vectorise_text

__all__ = ["HUB_OPTIONS", "load_hub", "load_hub_text", "parse_hub_name"]

# Column names tried, in order, when a hub dataset's columns are not given.
_HUB_IMAGE_COLUMNS = ("image", "img", "pixels")
_HUB_TEXT_COLUMNS = ("text",)
_HUB_LABEL_COLUMNS = ("label", "labels", "fine_label")
_HUB_RESERVED_KWARGS = ("dataset", "partitioners", "preprocessor")
# Options of a hub name (``hub:<id>?key=value&...``), see parse_hub_name.
HUB_OPTIONS = ("subset", "label", "positive", "scale")
_HUB_SCALES = ("standard",)


def parse_hub_name(name: str) -> tuple[str, dict[str, str]]:
    """Split ``"hub:<id>?key=value&..."`` into the dataset id and its options.

    Parameters
    ----------
    name : str
        ``"hub:<dataset-id>"``, optionally followed by ``?`` and ``key=value`` options joined
        by ``&`` (each key at most once):

        * ``subset``: the dataset's configuration (``FederatedDataset(subset=...)``, the
          ``name`` of ``datasets.load_dataset``), e.g. ``clf_cat_covertype``;
        * ``label``: the label column (as ``hub_label_column``), e.g. ``class``;
        * ``positive``: one-vs-rest binary labels, 1 where the label equals this value (a
          number for a numeric column, a class name or index for a ``ClassLabel``), else 0;
        * ``scale``: ``standard`` standardises every feature column with the training
          split's mean and standard deviation (ddof 0; a constant column is only centred),
          as the embedded ``breast-cancer``.

    Returns
    -------
    dataset_id : str
        The id, without the options.
    options : dict of str to str
        The options given (keys from :data:`HUB_OPTIONS`).

    Raises
    ------
    DataError
        For an empty id, an option that is not ``key=value``, an unknown or repeated key or
        an unknown ``scale``.

    References
    ----------
    Kassab & Simeone, "Federated Generalized Bayesian Learning via Distributed Stein
    Variational Gradient Descent" (2022), Sec. 7.2: Covertype as binary classification; the
    reference code (kclip/DSVGD) codes label 2 as -1 and label 1 as +1, i.e. ``positive=1``.
    """
    spec = name[len(HUB_PREFIX):].strip() if name.startswith(HUB_PREFIX) else name.strip()
    dataset_id, has_options, query = spec.partition("?")
    dataset_id = dataset_id.strip()
    if not dataset_id:
        raise DataError(f"empty hub dataset name {name!r}; use {HUB_PREFIX}<dataset-id>, e.g. hub:mnist")
    options: dict[str, str] = {}
    for item in query.split("&") if has_options else ():
        key, eq, value = (part.strip() for part in item.partition("="))
        if not (key and eq and value):
            raise DataError(f"hub dataset name {name!r}: option {item!r} is not key=value")
        if key not in HUB_OPTIONS:
            raise DataError(f"hub dataset name {name!r}: unknown option {key!r}; options: "
                            f"{', '.join(HUB_OPTIONS)}")
        if key in options:
            raise DataError(f"hub dataset name {name!r}: option {key!r} given twice")
        options[key] = value
    if options.get("scale", _HUB_SCALES[0]) not in _HUB_SCALES:
        raise DataError(f"hub dataset name {name!r}: unknown scale {options['scale']!r}; "
                        f"scales: {', '.join(_HUB_SCALES)}")
    return dataset_id, options


def _hub_holdout(dataset_id: str, test_fraction: float, report: dict):
    """``FederatedDataset`` preprocessor: check the train split, hold out a test split if absent.

    The number of held-out rows and of training rows before the split are stored in
    `report` under ``"holdout"`` and ``"rows"``.
    """

    def preprocess(dd):
        import datasets

        if "train" not in dd:
            raise DataError(
                f"hub dataset {dataset_id!r} has no 'train' split (splits: {', '.join(dd)})"
            )
        if "test" in dd:
            return dd
        n = dd["train"].num_rows
        if n < 2:
            raise DataError(
                f"hub dataset {dataset_id!r} has no 'test' split and too few rows ({n}) to hold one out"
            )
        perm = np.random.default_rng(0).permutation(n)
        n_test = num_test_rows(n, test_fraction)
        report.update(holdout=n_test, rows=n)
        train = dd["train"]
        return datasets.DatasetDict(
            {
                "train": train.select(np.sort(perm[n_test:])),
                "test": train.select(np.sort(perm[:n_test])),
            }
        )

    return preprocess


def _is_text(feature) -> bool:
    """Whether a ``datasets`` feature is a column of strings."""
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _hub_columns(
    features, dataset_id: str, target: str, feature_column, label_column
) -> tuple[list[str], str | None]:
    """Resolve the feature and label column names of a hub split.

    Detected feature columns: the first image column, else the first text column (see
    :data:`_HUB_TEXT_COLUMNS`), else every scalar numeric column other than the label. A
    text column must be the only feature column and needs target ``"none"``.
    """
    import datasets

    names = list(features)
    where = f"hub dataset {dataset_id!r}"
    if label_column is None:
        label_column = next((c for c in _HUB_LABEL_COLUMNS if c in features), None)
    elif label_column not in features:
        raise DataError(f"{where} has no label column {label_column!r}; columns: {', '.join(names)}")
    if feature_column is None:
        image = next((c for c in _HUB_IMAGE_COLUMNS if c in features), None)
        text = next((c for c in _HUB_TEXT_COLUMNS if c in features and _is_text(features[c])), None)
        if image is not None:
            columns = [image]
        elif text is not None:
            columns = [text]
        else:
            numeric = ("int", "uint", "float", "bool")
            columns = [
                c
                for c, f in features.items()
                if c != label_column
                and (
                    isinstance(f, datasets.ClassLabel)
                    or (isinstance(f, datasets.Value) and f.dtype.startswith(numeric))
                )
            ]
        if not columns:
            raise DataError(
                f"{where}: no image column ({', '.join(_HUB_IMAGE_COLUMNS)}), no text column "
                f"({', '.join(_HUB_TEXT_COLUMNS)}) and no numeric column; columns: "
                f"{', '.join(names)}; pass hub_feature_column"
            )
    else:
        columns = [feature_column] if isinstance(feature_column, str) else list(feature_column)
        missing = [c for c in columns if c not in features]
        if missing or not columns:
            raise DataError(
                f"{where} has no feature column {', '.join(map(repr, missing)) or '(none given)'}; "
                f"columns: {', '.join(names)}"
            )
    texts = [c for c in columns if _is_text(features[c])]
    if texts:
        if target != "none":
            raise DataError(
                f"{where}: feature column {texts[0]!r} holds text, which becomes word counts "
                f"only for a model without targets (target 'none', e.g. lda); this model needs "
                f"{needs(target)}"
            )
        if len(columns) > 1:
            raise DataError(
                f"{where}: text column {texts[0]!r} must be the only feature column, got "
                f"{', '.join(columns)}"
            )
    if target != "none" and label_column is None:
        raise DataError(
            f"{where} has no label column ({', '.join(_HUB_LABEL_COLUMNS)}); columns: "
            f"{', '.join(names)}; pass hub_label_column"
        )
    return columns, (None if target == "none" else label_column)


def _scale_pixels(a: np.ndarray, column: str, where: str) -> np.ndarray:
    """Pixels to [0, 1]: 8-bit range / 255, 16-bit / 65535, floats unchanged."""
    if a.dtype.kind == "b" or a.dtype.kind == "f":
        return a.astype(np.float64)
    if a.dtype.kind not in "iu":
        raise DataError(f"{where}: image column {column!r} must be numeric, got dtype {a.dtype}")
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    if a.dtype == np.uint8 or (lo >= 0 and hi <= 255):
        return a / 255.0
    if a.dtype == np.uint16 or (lo >= 0 and hi <= 65535):
        return a / 65535.0
    raise DataError(f"{where}: image column {column!r} has pixel values outside 0..65535 ({lo}..{hi})")


def _one_vs_rest(values, feature, positive: str, column: str, where: str) -> np.ndarray:
    """``1`` where a label of `column` equals `positive` (see :func:`parse_hub_name`), else ``0``."""
    import datasets

    values = np.asarray(values)
    if isinstance(feature, datasets.ClassLabel) and positive in feature.names:
        return (values == feature.str2int(positive)).astype(np.int64)
    if values.dtype.kind in "iufb":
        try:
            value = float(positive)
        except ValueError:
            raise DataError(f"{where}: positive={positive!r} is not a number, but label column "
                            f"{column!r} is numeric") from None
        return (values == value).astype(np.int64)
    return (values.astype(str) == positive).astype(np.int64)


def _hub_arrays(split, columns: list[str], label_column: str | None, where: str, target: str,
                positive: str | None = None):
    """Features (float64 ``(n, d)``) and targets of one hub split; with `positive`, one-vs-rest
    labels (:func:`_one_vs_rest`).

    Scalar columns are read through Arrow, which keeps their dtype (``datasets``' NumPy format
    turns float64 into float32); images and nested columns through the NumPy format.
    """
    import datasets

    names = columns + ([label_column] if label_column else [])
    scalar = [c for c in names if isinstance(split.features[c], datasets.Value)]
    data = split.select_columns(names).with_format("numpy")[:] if len(scalar) < len(names) else {}
    if scalar:
        table = split.select_columns(scalar).with_format("arrow")[:]
        data.update({c: table.column(c).to_numpy() for c in scalar})
    parts = []
    for column in columns:
        a = data[column]
        if a.dtype == object:  # ragged rows (e.g. images of different sizes)
            try:
                a = np.stack([np.asarray(v) for v in a])
            except ValueError:
                raise DataError(f"{where}: rows of column {column!r} have different shapes") from None
        is_image = isinstance(split.features[column], datasets.Image) or column in _HUB_IMAGE_COLUMNS
        if is_image:
            a = _scale_pixels(a, column, where)
        parts.append(as_float_array(a.reshape(a.shape[0], -1), column, where))
    x = as_x(np.concatenate(parts, axis=1), "+".join(columns), where)
    if label_column is None:
        return x, None
    labels = data[label_column]
    if positive is not None:
        labels = _one_vs_rest(labels, split.features[label_column], positive, label_column, where)
    return x, as_y(labels, label_column, where, target)


def _hub_text(train, test, column: str, where: str, max_features, stacklevel: int):
    """Word counts of the text `column` of the train and test splits, and the vocabulary.

    See :func:`vectorise_text`; dropped empty documents are reported with a
    :class:`DataWarning`.
    """
    docs = {}
    for split_name, split in (("train", train), ("test", test)):
        if not _is_text(split.features[column]):
            raise DataError(
                f"{where}: column {column!r} of split {split_name!r} is not text "
                f"({split.features[column]})"
            )
        docs[split_name] = split.select_columns([column]).with_format(None)[:][column]
    try:
        x_train, x_test, vocabulary = vectorise_text(docs["train"], docs["test"], max_features)
    except DataError as exc:
        raise DataError(f"{where}: text column {column!r}: {exc}") from None
    dropped = [
        f"{len(docs[s]) - x.shape[0]} of {len(docs[s])} {label} documents"
        for s, x, label in (("train", x_train, "training"), ("test", x_test, "test"))
        if len(docs[s]) > x.shape[0]
    ]
    if dropped:
        warnings.warn(
            f"{where}: dropped {' and '.join(dropped)} with no vocabulary word "
            "(empty, or only stop words, numbers or rare words)",
            DataWarning,
            stacklevel=stacklevel + 1,
        )
    return x_train, x_test, vocabulary


def load_hub(
    name: str,
    target: str,
    *,
    test_fraction: float,
    hub_kwargs: dict | None,
    feature_column,
    label_column: str | None,
    max_features: int | None = TEXT_MAX_FEATURES,
) -> Dataset:
    """Load a hub dataset ``"hub:<id>"`` for a model needing `target`.

    Parameters
    ----------
    name : str
        ``"hub:<dataset-id>"``, optionally with ``?key=value&...`` options (``subset``,
        ``label``, ``positive``, ``scale``; :func:`parse_hub_name`). ``label`` and ``subset``
        must agree with `label_column` and ``hub_kwargs["subset"]`` when those are given too.
    target : str
        The target kind the model needs, one of :data:`fedbayes_flwr.data.TARGETS`;
        with ``"none"`` no label column is read.
    test_fraction : float
        Fraction of the training rows held out (fixed permutation, seed 0) when the
        dataset has no ``"test"`` split.
    hub_kwargs : dict or None
        Extra keyword arguments of ``flwr_datasets.FederatedDataset``.
    feature_column : str or sequence of str or None
        Input column(s); ``None`` to detect them: the first image column (``"image"``,
        ``"img"``, ``"pixels"``), else a ``"text"`` column of strings, else every scalar
        numeric column other than the label.
    label_column : str or None
        Target column; ``None`` to detect it. Not read for target ``"none"``.
    max_features : int or None, optional
        Text columns only: vocabulary size cap of :func:`~fedbayes_flwr.data.text.vectorise_text`
        (default :data:`~fedbayes_flwr.data.text.TEXT_MAX_FEATURES`); ``None`` for no cap.

    Returns
    -------
    Dataset
        Named `name`. ``holdout_rows`` is the number of training rows held out as the
        test set (0 when the dataset has a ``"test"`` split); when rows are held out a
        :class:`DataWarning` says so. For a text column, ``x_train`` and ``x_test`` are
        word counts (one row per non-empty document, one column per vocabulary word).

    Raises
    ------
    DataError
        When the dataset cannot be loaded or its columns do not fit, e.g. a text column
        for a model that needs targets.

    Warns
    -----
    DataWarning
        When rows are held out as the test set, and when documents of a text column are
        dropped because no vocabulary word is left in them.

    Notes
    -----
    A text column (a string feature: the detected ``"text"`` column or the one given as
    `feature_column`) is turned into bag-of-words counts by
    :func:`~fedbayes_flwr.data.text.vectorise_text`: lower-cased letter-only tokens,
    English stop words removed, vocabulary fitted on the training split only and capped
    at `max_features`, the test split counted with the training vocabulary, documents
    left empty dropped. Words are stemmed only when NLTK is installed. The vocabulary
    (the word of each column) is not part of the :class:`Dataset`; it is the third value
    of ``vectorise_text`` called on the same two splits' documents with the same
    `max_features`, which is deterministic; :func:`load_hub_text` returns it.
    """
    return _load(
        name,
        target,
        test_fraction=test_fraction,
        hub_kwargs=hub_kwargs,
        feature_column=feature_column,
        label_column=label_column,
        max_features=max_features,
        stacklevel=3,  # warnings point at the caller of load_dataset
    )[0]


def load_hub_text(
    name: str,
    *,
    test_fraction: float = 0.2,
    hub_kwargs: dict | None = None,
    feature_column: str | None = None,
    max_features: int | None = TEXT_MAX_FEATURES,
) -> tuple[Dataset, list[str]]:
    """Load a hub text corpus as word counts, with its vocabulary (e.g. for LDA topics).

    The same data as ``load_dataset(name, "none", hub_kwargs=..., hub_feature_column=...,
    hub_max_features=...)``, plus the word of each column.

    Parameters
    ----------
    name : str
        ``"hub:<dataset-id>"``, e.g. ``"hub:SetFit/20_newsgroups"``.
    test_fraction : float, optional
        Fraction of the training documents held out (fixed permutation, seed 0) when the
        dataset has no ``"test"`` split.
    hub_kwargs : dict or None, optional
        Extra keyword arguments of ``flwr_datasets.FederatedDataset``.
    feature_column : str or None, optional
        The text column; ``None`` for a ``"text"`` column.
    max_features : int or None, optional
        Vocabulary size cap (default :data:`~fedbayes_flwr.data.text.TEXT_MAX_FEATURES`);
        ``None`` for no cap.

    Returns
    -------
    dataset : Dataset
        Word counts of the non-empty documents, no targets.
    vocabulary : list of str
        ``vocabulary[j]`` is the word counted by column ``j`` of ``dataset.x_train`` and
        ``dataset.x_test`` (and of a fitted LDA's topic-word matrix).

    Raises
    ------
    DataError
        When the dataset cannot be loaded or its feature column is not text.

    Warns
    -----
    DataWarning
        When documents are held out as the test set or dropped as empty.
    """
    test_fraction = float(test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test fraction must be strictly between 0 and 1, got {test_fraction}")
    dataset, vocabulary = _load(
        name,
        "none",
        test_fraction=test_fraction,
        hub_kwargs=hub_kwargs,
        feature_column=feature_column,
        label_column=None,
        max_features=max_features,
        stacklevel=2,
    )
    if vocabulary is None:
        raise DataError(
            f"hub dataset {parse_hub_name(name)[0]!r}: feature column(s) "
            f"{feature_column or '(detected)'} hold no text; pass the text column as feature_column"
        )
    return dataset, vocabulary


def _load(
    name: str,
    target: str,
    *,
    test_fraction: float,
    hub_kwargs: dict | None,
    feature_column,
    label_column: str | None,
    max_features: int | None,
    stacklevel: int,
) -> tuple[Dataset, list[str] | None]:
    """:func:`load_hub`, also returning the vocabulary of a text column (else ``None``).

    `stacklevel` is the warnings' stack level as seen from the caller of this function.
    """
    dataset_id, options = parse_hub_name(name)
    kwargs = dict(hub_kwargs or {})
    reserved = [k for k in _HUB_RESERVED_KWARGS if k in kwargs]
    if reserved:
        raise DataError(f"hub_kwargs must not set {', '.join(reserved)} (set by load_dataset)")
    for option, given, what in (("subset", kwargs.get("subset"), "hub_kwargs['subset']"),
                                ("label", label_column, "hub_label_column")):
        if option in options and given is not None and given != options[option]:
            raise DataError(f"hub dataset name {name!r} sets {option}={options[option]!r} but "
                            f"{what} is {given!r}")
    if "subset" in options:
        kwargs["subset"] = options["subset"]
    label_column = options.get("label", label_column)
    positive = options.get("positive")
    if positive is not None and target == "none":
        raise DataError(f"hub dataset name {name!r}: positive= codes labels, but this model "
                        "reads no label (target 'none')")
    kwargs.setdefault("shuffle", False)
    report: dict = {}
    try:
        from flwr_datasets import FederatedDataset
        from flwr_datasets.partitioner import IidPartitioner

        fds = FederatedDataset(
            dataset=dataset_id,
            partitioners={"train": IidPartitioner(num_partitions=1)},
            preprocessor=_hub_holdout(dataset_id, test_fraction, report),
            **kwargs,
        )
        train = fds.load_partition(0, "train")
        test = fds.load_split("test")
    except DataError:
        raise
    except Exception as exc:  # network, missing files, unknown id, bad kwargs
        raise DataError(
            f"could not load hub dataset {dataset_id!r}: {one_line(exc)}; "
            "no network? use an embedded dataset or --data FILE.npz"
        ) from None
    where = f"hub dataset {dataset_id!r}"
    columns, label = _hub_columns(train.features, dataset_id, target, feature_column, label_column)
    for split_name, split in (("train", train), ("test", test)):
        missing = [c for c in columns + ([label] if label else []) if c not in split.features]
        if missing:
            raise DataError(f"{where}: split {split_name!r} lacks column(s) {', '.join(missing)}")
    vocabulary = None
    if _is_text(train.features[columns[0]]):
        if "scale" in options:
            raise DataError(f"{where}: scale= applies to numeric features, not to the word "
                            f"counts of text column {columns[0]!r}")
        x_train, x_test, vocabulary = _hub_text(
            train, test, columns[0], where, max_features, stacklevel + 1
        )
        y_train = y_test = None  # a text column needs target "none" (checked above)
    else:
        x_train, y_train = _hub_arrays(train, columns, label, f"{where} (train)", target, positive)
        x_test, y_test = _hub_arrays(test, columns, label, f"{where} (test)", target, positive)
    if x_test.shape[1] != x_train.shape[1]:
        raise DataError(
            f"{where}: test rows have {x_test.shape[1]} features but train rows have {x_train.shape[1]}"
        )
    if positive is not None and y_train.min() == y_train.max():
        raise DataError(f"{where}: positive={positive!r} matches {'every' if y_train[0] else 'no'} "
                        f"training row's {label!r}; one-vs-rest needs both classes")
    if options.get("scale") == "standard":
        x_train, x_test = standardise(x_train, x_test)
    holdout = int(report.get("holdout", 0))
    if holdout:
        warnings.warn(
            f"{where} has no 'test' split: held out {holdout} of {report['rows']} rows "
            f"(test-fraction {test_fraction:g}) as the test set",
            DataWarning,
            stacklevel=stacklevel + 1,
        )
    return Dataset(x_train, y_train, x_test, y_test, None, name, holdout), vocabulary
