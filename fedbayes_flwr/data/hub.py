"""Hugging Face datasets (``"hub:<id>"``) loaded through ``flwr_datasets.FederatedDataset``.

``flwr_datasets`` and ``datasets`` are imported lazily, when a hub dataset is loaded.
"""

from __future__ import annotations

import warnings

import numpy as np

from .base import (
    HUB_PREFIX,
    DataError,
    Dataset,
    DataWarning,
    as_float_array,
    as_x,
    as_y,
    num_test_rows,
    one_line,
)

__all__ = ["load_hub"]

# Column names tried, in order, when a hub dataset's columns are not given.
_HUB_IMAGE_COLUMNS = ("image", "img", "pixels")
_HUB_LABEL_COLUMNS = ("label", "labels", "fine_label")
_HUB_RESERVED_KWARGS = ("dataset", "partitioners", "preprocessor")


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


def _hub_columns(
    features, dataset_id: str, target: str, feature_column, label_column
) -> tuple[list[str], str | None]:
    """Resolve the feature and label column names of a hub split."""
    import datasets

    names = list(features)
    where = f"hub dataset {dataset_id!r}"
    if label_column is None:
        label_column = next((c for c in _HUB_LABEL_COLUMNS if c in features), None)
    elif label_column not in features:
        raise DataError(f"{where} has no label column {label_column!r}; columns: {', '.join(names)}")
    if target != "none" and label_column is None:
        raise DataError(
            f"{where} has no label column ({', '.join(_HUB_LABEL_COLUMNS)}); columns: "
            f"{', '.join(names)}; pass hub_label_column"
        )
    if feature_column is None:
        image = next((c for c in _HUB_IMAGE_COLUMNS if c in features), None)
        if image is not None:
            columns = [image]
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
                f"{where}: no image column ({', '.join(_HUB_IMAGE_COLUMNS)}) and no numeric "
                f"column; columns: {', '.join(names)}; pass hub_feature_column"
            )
    else:
        columns = [feature_column] if isinstance(feature_column, str) else list(feature_column)
        missing = [c for c in columns if c not in features]
        if missing or not columns:
            raise DataError(
                f"{where} has no feature column {', '.join(map(repr, missing)) or '(none given)'}; "
                f"columns: {', '.join(names)}"
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


def _hub_arrays(split, columns: list[str], label_column: str | None, where: str, target: str):
    """Features (float64 ``(n, d)``) and targets of one hub split."""
    import datasets

    data = split.select_columns(columns + ([label_column] if label_column else [])).with_format("numpy")[:]
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
    y = None if label_column is None else as_y(data[label_column], label_column, where, target)
    return x, y


def load_hub(
    name: str,
    target: str,
    *,
    test_fraction: float,
    hub_kwargs: dict | None,
    feature_column,
    label_column: str | None,
) -> Dataset:
    """Load a hub dataset ``"hub:<id>"`` for a model needing `target`.

    Parameters
    ----------
    name : str
        ``"hub:<dataset-id>"``.
    target : str
        The target kind the model needs, one of :data:`fedbayes_flwr.data.TARGETS`;
        with ``"none"`` no label column is read.
    test_fraction : float
        Fraction of the training rows held out (fixed permutation, seed 0) when the
        dataset has no ``"test"`` split.
    hub_kwargs : dict or None
        Extra keyword arguments of ``flwr_datasets.FederatedDataset``.
    feature_column : str or sequence of str or None
        Input column(s); ``None`` to detect them.
    label_column : str or None
        Target column; ``None`` to detect it.

    Returns
    -------
    Dataset
        Named `name`. ``holdout_rows`` is the number of training rows held out as the
        test set (0 when the dataset has a ``"test"`` split); when rows are held out a
        :class:`DataWarning` says so.

    Raises
    ------
    DataError
        When the dataset cannot be loaded or its columns do not fit.
    """
    dataset_id = name[len(HUB_PREFIX):].strip()
    if not dataset_id:
        raise DataError(f"empty hub dataset name {name!r}; use {HUB_PREFIX}<dataset-id>, e.g. hub:mnist")
    kwargs = dict(hub_kwargs or {})
    reserved = [k for k in _HUB_RESERVED_KWARGS if k in kwargs]
    if reserved:
        raise DataError(f"hub_kwargs must not set {', '.join(reserved)} (set by load_dataset)")
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
    x_train, y_train = _hub_arrays(train, columns, label, f"{where} (train)", target)
    x_test, y_test = _hub_arrays(test, columns, label, f"{where} (test)", target)
    if x_test.shape[1] != x_train.shape[1]:
        raise DataError(
            f"{where}: test rows have {x_test.shape[1]} features but train rows have {x_train.shape[1]}"
        )
    holdout = int(report.get("holdout", 0))
    if holdout:
        warnings.warn(
            f"{where} has no 'test' split: held out {holdout} of {report['rows']} rows "
            f"(test-fraction {test_fraction:g}) as the test set",
            DataWarning,
            stacklevel=3,
        )
    return Dataset(x_train, y_train, x_test, y_test, None, name, holdout)
