"""Datasets and client partitions for the federated Bayesian experiments.

Two public entry points:

* :func:`load_dataset` returns a :class:`Dataset` (train/test arrays) from one of the
  embedded sets (:data:`DATASETS`), from a Hugging Face dataset named ``"hub:<id>"``
  (loaded through ``flwr_datasets.FederatedDataset``) or from a user ``.npz`` file,
  with targets of the kind the model needs (:data:`TARGETS`).
* :func:`partition_indices` splits the training rows over clients with one of the
  schemes in :data:`PARTITIONS`, using the partitioners of ``flwr-datasets``.

Bad data or configuration raises :class:`DataError` with a one-line message; rows held
out as a test set from a source without one are reported with a :class:`DataWarning`.

The package knows no model names. Modules: :mod:`.base` (types, errors, helpers),
:mod:`.embedded` (scikit-learn sets, twonorm, mixture-1d), :mod:`.synthetic` (generated data), :mod:`.npz`
(user files), :mod:`.hub` (hub datasets), :mod:`.partitions` (client splits).
"""

from __future__ import annotations

from fedbayes_flwr.data.amps_sets import AMPS_SETS, load_amps_set
from fedbayes_flwr.data.base import (
    DATASET_DESCRIPTIONS,
    DATASETS,
    HUB_PREFIX,
    TARGETS,
    DataError,
    Dataset,
    DataWarning,
    check_target,
    is_dataset_name,
)
from fedbayes_flwr.data.embedded import EMBEDDED, load_embedded
from fedbayes_flwr.data.hub import load_hub
from fedbayes_flwr.data.npz import load_npz
from fedbayes_flwr.data.partitions import PARTITIONS, partition_indices
from fedbayes_flwr.data.synthetic import SYNTHETIC, make_synthetic, resolve_synthetic
from fedbayes_flwr.data.text import TEXT_MAX_FEATURES

__all__ = [
    "DATASETS",
    "DATASET_DESCRIPTIONS",
    "HUB_PREFIX",
    "PARTITIONS",
    "SYNTHETIC",
    "TARGETS",
    "DataError",
    "DataWarning",
    "Dataset",
    "is_dataset_name",
    "load_dataset",
    "partition_indices",
]


def load_dataset(
    name: str,
    target: str,
    *,
    synthetic: str | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    data_file: str = "",
    synthetic_size: int = 200,
    synthetic_dim: int = 3,
    noise_scale: float = 1.0,
    hub_kwargs: dict | None = None,
    hub_feature_column: str | list[str] | tuple[str, ...] | None = None,
    hub_label_column: str | None = None,
    hub_max_features: int | None = TEXT_MAX_FEATURES,
) -> Dataset:
    """Load an embedded dataset, a hub dataset or a user ``.npz`` file for a model.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS`, or ``"hub:<dataset-id>"`` (e.g. ``"hub:mnist"``,
        ``"hub:ylecun/mnist"``) for a Hugging Face dataset. Ignored when `data_file`
        is given. The embedded sets are

        * ``"breast-cancer"``: 569 x 30, binary labels, standardised features; for
          targets ``"binary"`` or ``"multiclass"``.
        * ``"diabetes"``: 442 x 10 regression, features and target standardised; for
          target ``"real"``.
        * ``"digits"``: scikit-learn's 1797 8x8 handwritten digits, 64 pixel features
          scaled to [0, 1] by dividing by 16 (not standardised, so the pixels keep their
          meaning), 10 classes; for target ``"multiclass"``.
        * ``"synthetic"``: generated from `seed` by the generator `synthetic` (see
          below), for any target its generator fits.
        * ``"twonorm"``: Breiman's (1996) twonorm, 7400 x 20, ``x | y ~ N(a 1, I)`` for
          ``y = 1`` and ``N(-a 1, I)`` for ``y = 0`` with ``a = 2 / sqrt(20)``, 3700 rows
          per class, generated from a fixed internal seed (the same data for every run),
          not standardised; stratified fixed split like ``"breast-cancer"``; for targets
          ``"binary"`` or ``"multiclass"``. Used by DSVGD's Bayesian logistic regression
          (Kassab & Simeone 2022, Section 7).
        * ``"mnist-like"``: MNIST-shaped data generated from a fixed seed (no download),
          60,000 training and 10,000 test rows of 28 x 28 pixels in [0, 1], 10 classes from
          a random teacher network (:mod:`fedbayes_flwr.data.mnist_like`); for target
          ``"multiclass"``; `test_fraction` does not apply (MNIST's split).
        * ``"mixture-1d"``: the two local likelihoods of DSVGD's 1-D toy (Kassab &
          Simeone 2022, Section 7.1), one row per agent, each row ``(w_1, m_1, v_1, w_2,
          m_2, v_2)`` meaning ``sum_j w_j N(theta | m_j, v_j)`` (``v`` a variance):
          ``[1, 1, 4, 0, 0, 1]`` (``N(theta | 1, 4)``) and ``[1, -3, 1, 1, 3, 2]``
          (``N(theta | -3, 1) + N(theta | 3, 2)``). The rows are likelihood
          specifications, not samples: the test rows are the same two rows (no holdout,
          `test_fraction` unused); for target ``"none"`` only. Partitioned over 2
          clients with ``"dirichlet"`` (the run configuration's default) or ``"iid"``,
          each client gets one row.
        * ``"amps-mixture"``, ``"amps-gaussian"``, ``"lda-corpus"``, ``"latent-features"``:
          the AMPS paper's data, generated from `seed` (fresh data per seed) at the paper's
          sizes with their own held-out rows (`test_fraction` unused); for target
          ``"none"``. See :mod:`fedbayes_flwr.data.amps_sets`.
    target : str
        The target kind the model needs, one of :data:`TARGETS`: ``"none"`` (no
        targets, ``y_train`` and ``y_test`` are ``None``), ``"real"`` (float64
        regression targets), ``"binary"`` (int64 labels in {0, 1}) or ``"multiclass"``
        (int64 labels ``>= 0``; binary sets fit too).
    synthetic : str or None, optional
        Synthetic generator for ``name="synthetic"``, one of :data:`SYNTHETIC`; its
        targets must fit `target`. ``None`` picks the default of `target`: ``"none"``
        -> ``"gaussian-mean"``, ``"real"`` -> ``"linear"``, ``"binary"`` ->
        ``"logistic"``, ``"multiclass"`` -> ``"softmax"``. Checked for every dataset,
        used only for the synthetic one.
    seed : int, optional
        Seed for synthetic data and for the test split of user files. The embedded
        real datasets use a fixed split (``random_state=0``, stratified for
        classification) independent of `seed`, so results are comparable across seeds;
        so do hub datasets without a ``"test"`` split.
    test_fraction : float, optional
        Fraction of rows held out as test set, in (0, 1). Not used when the data
        file supplies ``x_test`` or the hub dataset has a ``"test"`` split.
    data_file : str, optional
        Path of a ``.npz`` file with keys ``x_train`` (required), ``y_train``,
        ``x_test``, ``y_test`` and ``client_id`` (optional). User data is not
        standardised. Without ``x_test``, `test_fraction` of the rows are held out as
        the test set: ``Dataset.holdout_rows`` counts them and a :class:`DataWarning`
        reports them.
    synthetic_size : int, optional
        Total number of rows (train plus test) of the synthetic dataset.
    synthetic_dim : int, optional
        Input dimension of the synthetic dataset (``mixture-1d``: mixture components per
        row, ``3 * synthetic_dim`` columns).
    noise_scale : float, optional
        Observation noise standard deviation of the synthetic ``gaussian-mean``,
        ``linear`` and ``sine`` data. Synthetic data are: ``gaussian-mean``
        ``x ~ N(mu, noise^2 I)``; ``linear`` ``y = x.w + noise``; ``logistic``
        ``y ~ Bernoulli(sigmoid(x.w + b))``; ``softmax`` 3 classes drawn from a random
        linear softmax model ``softmax(x W + b)``; ``sine`` ``y = 2 sin(2 x.w) + noise``
        with ``w ~ N(0, I / d)``; ``mixture-1d`` random likelihood rows (weights in
        [0.5, 1.5], means in [-4, 4], variances in [0.5, 4]).
    hub_kwargs : dict or None, optional
        Hub datasets only: extra keyword arguments of
        ``flwr_datasets.FederatedDataset`` (e.g. ``subset``, ``shuffle``, ``seed``),
        which passes the ones it does not know on to ``datasets.load_dataset`` (e.g.
        ``data_files``, ``cache_dir``, ``revision``). A local dataset takes the same
        code path: ``name="hub:parquet"`` with
        ``hub_kwargs={"data_files": {"train": ..., "test": ...}}``. ``shuffle``
        defaults to ``False`` here (rows kept in source order).
    hub_feature_column : str or sequence of str or None, optional
        Hub datasets only: the input column(s). By default the first of ``"image"``,
        ``"img"``, ``"pixels"`` present, else a ``"text"`` column of strings, else every
        scalar numeric column other than the label. Each row is flattened; several
        columns are concatenated. A text column (any column of strings) must be the only
        one and needs target ``"none"``; it becomes word counts (see Notes).
    hub_label_column : str or None, optional
        Hub datasets only: the target column. By default the first of ``"label"``,
        ``"labels"``, ``"fine_label"`` present. Not read for target ``"none"``.
    hub_max_features : int or None, optional
        Hub text columns only: the vocabulary size, the most frequent training words
        (default :data:`fedbayes_flwr.data.text.TEXT_MAX_FEATURES`, 2000); ``None``
        keeps every word.

    Returns
    -------
    Dataset
        Float arrays are float64 and C-contiguous.

    Raises
    ------
    DataError
        On an unknown target, generator or dataset, a dataset whose targets do not fit
        the target kind, bad parameters, an invalid data file or a hub dataset that
        cannot be loaded.

    Warns
    -----
    DataWarning
        When rows of a data file without ``x_test`` (or of a hub dataset without a
        ``"test"`` split) are held out as the test set, and when documents of a hub text
        column are dropped as empty.

    Notes
    -----
    Hub datasets are loaded with ``FederatedDataset(dataset=<id>, partitioners={"train":
    IidPartitioner(1)}, ...)``: the single train partition is the training set and
    ``load_split("test")`` the test set. When there is no ``"test"`` split,
    `test_fraction` of the training rows are held out with a fixed permutation (seed
    0). Image columns (a ``datasets.Image`` feature or a column named ``"image"``,
    ``"img"`` or ``"pixels"``) are flattened and scaled to [0, 1]: integer pixels in
    0..255 are divided by 255, other unsigned 16-bit pixels by 65535, float pixels are
    kept as they are. Other feature columns are not rescaled.

    A hub text column (e.g. ``text`` of ``"hub:SetFit/20_newsgroups"``, for LDA) becomes
    bag-of-words counts (:func:`fedbayes_flwr.data.text.vectorise_text`): lower-cased
    tokens of two or more letters, English stop words removed, vocabulary fitted on the
    training split only and capped at `hub_max_features`, the test split counted with
    the training vocabulary, documents left with no word dropped. Words are stemmed only
    when NLTK is installed (not a dependency), so by default they are not. The labels are
    ignored. :func:`fedbayes_flwr.data.hub.load_hub_text` returns the same counts with
    the vocabulary (the word of each column).
    """
    check_target(target)
    generator = resolve_synthetic(synthetic, target)
    test_fraction = float(test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test fraction must be strictly between 0 and 1, got {test_fraction}")
    if data_file:
        return load_npz(data_file, target, seed=seed, test_fraction=test_fraction)
    if name in EMBEDDED:
        return load_embedded(name, target, test_fraction)
    if name in AMPS_SETS:
        return load_amps_set(name, target, seed)
    if name == "synthetic":
        return make_synthetic(
            generator,
            target,
            seed=seed,
            test_fraction=test_fraction,
            size=synthetic_size,
            dim=synthetic_dim,
            noise_scale=noise_scale,
        )
    if name.startswith(HUB_PREFIX):
        return load_hub(
            name,
            target,
            test_fraction=test_fraction,
            hub_kwargs=hub_kwargs,
            feature_column=hub_feature_column,
            label_column=hub_label_column,
            max_features=hub_max_features,
        )
    raise DataError(
        f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)} "
        f"or {HUB_PREFIX}<dataset-id>"
    )
