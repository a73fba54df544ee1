"""Text documents to bag-of-words count matrices (for LDA on hub text corpora).

:func:`vectorise_text` turns the documents of a training and a test split into word-count
matrices with scikit-learn's ``CountVectorizer``: lower-cased tokens of two or more ASCII
letters (digits, punctuation and single letters are dropped), scikit-learn's English stop
words removed, the vocabulary fitted on the training documents only and capped at the
`max_features` most frequent words. :func:`fedbayes_flwr.data.load_dataset` uses it for a
hub dataset whose feature column holds text (e.g. ``"hub:SetFit/20_newsgroups"``, column
``text``) when the model needs no targets (LDA).

Stemming: the AMPS paper's 20 newsgroups corpus was stemmed. Words are stemmed here only
when NLTK is installed (``nltk.stem.PorterStemmer``, imported lazily); this project does not
depend on NLTK, so by default the words are *not* stemmed and the vocabulary is larger than
the paper's (``"model"``, ``"models"`` and ``"modeling"`` are three words).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedbayes_flwr.data.base import DataError, f64

__all__ = ["TEXT_MAX_FEATURES", "TOKEN_PATTERN", "vectorise_text"]

TEXT_MAX_FEATURES = 2000
"""Default vocabulary size: the most frequent training words kept by :func:`vectorise_text`.

With it a count matrix takes 16 kB per document (float64), e.g. about 180 MB for the
11,314 training documents of 20 newsgroups."""

TOKEN_PATTERN = r"(?u)\b[a-zA-Z]{2,}\b"
"""Regular expression of a token: two or more ASCII letters between word boundaries."""


def _porter_stemmer() -> Callable[[str], str] | None:
    """NLTK's Porter stemmer's ``stem`` method, or ``None`` when NLTK is not installed."""
    try:
        from nltk.stem import PorterStemmer
    except ImportError:
        return None
    return PorterStemmer().stem


def _documents(docs: Sequence[str | None], split: str) -> list[str]:
    """`docs` as a list of strings; ``None`` (a missing value) becomes the empty document."""
    if isinstance(docs, str):
        raise DataError(f"{split} documents must be a sequence of strings, got one string")
    out = []
    for i, doc in enumerate(docs):
        if doc is None:
            doc = ""
        if not isinstance(doc, str):
            raise DataError(
                f"{split} document {i} is not text (got {type(doc).__name__}); "
                "a text column must hold strings"
            )
        out.append(doc)
    if not out:
        raise DataError(f"no {split} documents")
    return out


def vectorise_text(
    train_docs: Sequence[str | None],
    test_docs: Sequence[str | None],
    max_features: int | None = TEXT_MAX_FEATURES,
    *,
    stem: bool | None = None,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Bag-of-words count matrices of a training and a test split of text documents.

    The documents are lower-cased and split into tokens of two or more ASCII letters
    (:data:`TOKEN_PATTERN`); scikit-learn's English stop words are removed (before
    stemming); the vocabulary is the `max_features` words with the largest total count
    over the *training* documents, and the test documents are counted with that
    vocabulary (test-only words are ignored). Documents with no vocabulary word left are
    dropped from both splits.

    Parameters
    ----------
    train_docs : sequence of str or None
        Training documents; the vocabulary is fitted on them. ``None`` is an empty
        document.
    test_docs : sequence of str or None
        Test documents, counted with the training vocabulary.
    max_features : int or None, optional
        Vocabulary size cap (default :data:`TEXT_MAX_FEATURES`); ``None`` keeps every
        training word.
    stem : bool or None, optional
        Stem the tokens with NLTK's Porter stemmer. ``None`` (default) stems when NLTK
        is installed and keeps the words unstemmed otherwise; ``True`` requires NLTK.

    Returns
    -------
    x_train : numpy.ndarray
        float64 ``(n, V)`` word counts (non-negative integers) of the ``n`` non-empty
        training documents, in their original order.
    x_test : numpy.ndarray
        float64 ``(m, V)`` word counts of the ``m`` non-empty test documents.
    vocabulary : list of str
        The ``V`` words (stems when stemmed) in column order, sorted alphabetically:
        column ``j`` of the count matrices (and of a fitted LDA's topic-word matrix)
        counts ``vocabulary[j]``.

    Raises
    ------
    DataError
        When a document is not a string (or ``None``), a split is empty, `max_features`
        is not a positive integer, `stem` is ``True`` without NLTK, no training word is
        left (e.g. only stop words), or every test document is left empty.

    Notes
    -----
    The number of dropped documents of each split is ``len(docs) - x.shape[0]``.
    Without NLTK the words are not stemmed (the AMPS paper's 20 newsgroups corpus was),
    so the vocabulary holds inflected forms as separate words.

    Examples
    --------
    >>> x_train, x_test, vocabulary = vectorise_text(
    ...     ["The cat sat on the mat.", "Dogs and cats!"], ["A cat, 2 dogs"], stem=False)
    >>> vocabulary
    ['cat', 'cats', 'dogs', 'mat', 'sat']
    >>> x_test.tolist()
    [[1.0, 0.0, 1.0, 0.0, 0.0]]
    """
    from sklearn.feature_extraction.text import CountVectorizer

    train = _documents(train_docs, "training")
    test = _documents(test_docs, "test")
    if max_features is not None:
        if isinstance(max_features, bool) or not isinstance(max_features, (int, np.integer)) \
                or max_features < 1:
            raise DataError(f"max_features must be a positive integer or None, got {max_features!r}")
        max_features = int(max_features)
    stemmer = None
    if stem is None or stem:
        stemmer = _porter_stemmer()
        if stem and stemmer is None:
            raise DataError("stemming needs NLTK (pip install nltk), which is not installed")

    words = CountVectorizer(lowercase=True, token_pattern=TOKEN_PATTERN, stop_words="english")
    if stemmer is None:
        vectoriser = words
        vectoriser.set_params(max_features=max_features, dtype=np.int64)
    else:
        tokens = words.build_analyzer()  # lower-cased tokens, stop words removed

        def analyse(doc: str) -> list[str]:
            return [stemmer(token) for token in tokens(doc)]

        vectoriser = CountVectorizer(
            analyzer=analyse, token_pattern=None, max_features=max_features, dtype=np.int64
        )
    try:
        counts_train = vectoriser.fit_transform(train)
    except ValueError as exc:  # "empty vocabulary; perhaps the documents only contain stop words"
        raise DataError(
            f"no word left in the training documents after removing stop words ({exc})"
        ) from None
    counts_test = vectoriser.transform(test)
    vocabulary = [str(w) for w in vectoriser.get_feature_names_out()]
    keep_train = np.asarray(counts_train.sum(axis=1)).ravel() > 0
    keep_test = np.asarray(counts_test.sum(axis=1)).ravel() > 0
    if not keep_test.any():
        raise DataError(
            f"every one of the {len(test)} test documents is empty with the training "
            f"vocabulary ({len(vocabulary)} words)"
        )
    x_train = f64(counts_train[keep_train].toarray())
    x_test = f64(counts_test[keep_test].toarray())
    return x_train, x_test, vocabulary
