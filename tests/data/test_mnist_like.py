"""``mnist-like``: MNIST's shape and split, fixed data, balanced and learnable labels."""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.data import DataError, load_dataset
from fedbayes_flwr.data.mnist_like import MNIST_LIKE_CLASSES, make_mnist_like


@pytest.fixture(scope="module")
def full():
    return load_dataset("mnist-like", "multiclass")


def test_shape_range_and_split(full):
    assert full.x_train.shape == (60_000, 784) and full.x_test.shape == (10_000, 784)
    assert full.x_train.dtype == np.float64 and full.y_train.dtype == np.int64
    assert 0.0 <= full.x_train.min() and full.x_train.max() <= 1.0
    assert set(np.unique(full.y_train)) == set(range(MNIST_LIKE_CLASSES))
    assert full.name == "mnist-like" and full.holdout_rows == 0


def test_classes_about_equally_frequent(full):
    # Each class's frequency is 0.1 up to the bias fit on 20,000 pilot latents (sd
    # sqrt(0.1 * 0.9 / 20,000) = 0.0021) and the sampling of 60,000 rows (sd 0.0012): 0.012 is
    # about 5 combined sd. Without the balancing bias the classes ranged over 0.03-0.25.
    freq = np.bincount(full.y_train, minlength=MNIST_LIKE_CLASSES) / full.y_train.size
    assert np.max(np.abs(freq - 0.1)) < 0.012, freq


def test_fixed_and_a_prefix_of_the_full_set(full):
    small = make_mnist_like(size=1_000, test_rows=100)
    np.testing.assert_array_equal(small.x_train, full.x_train[:900])
    np.testing.assert_array_equal(small.y_train, full.y_train[:900])
    again = make_mnist_like(size=1_000, test_rows=100)
    np.testing.assert_array_equal(again.x_test, small.x_test)


def test_images_are_smooth_and_labels_learnable(full):
    img = full.x_train[:200].reshape(-1, 28, 28)
    # neighbouring pixels are far closer than random pairs of pixels: the images are smooth
    step = np.mean(np.abs(np.diff(img, axis=2)))
    shuffled = np.mean(np.abs(img - img[:, :, np.random.default_rng(0).permutation(28)]))
    assert step < 0.3 * shuffled
    from sklearn.linear_model import LogisticRegression

    # A linear softmax on 3,000 rows is far above chance (0.1) on the test rows: the labels are a
    # function of the image (measured 0.5-0.6), and below the teacher's Bayes accuracy (~0.81).
    fit = LogisticRegression(max_iter=200).fit(full.x_train[:3000], full.y_train[:3000])
    accuracy = fit.score(full.x_test[:2000], full.y_test[:2000])
    assert 0.3 < accuracy < 0.81


def test_wrong_target_and_bad_sizes():
    with pytest.raises(DataError, match="'mnist-like' has 10-class labels; this model needs binary"):
        load_dataset("mnist-like", "binary")
    with pytest.raises(ValueError, match="0 < test rows < rows"):
        make_mnist_like(size=10, test_rows=10)
