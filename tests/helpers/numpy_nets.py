"""A plain-numpy ReLU network with the library's parameter layout: the reference BNN tests
compare TensorFlow against."""

import numpy as np


def numpy_forward(theta, x, sizes):
    """Outputs of the network ``sizes`` (input, hidden..., output) at parameters ``theta``."""
    h, offset = x, 0
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        w = theta[offset:offset + a * b].reshape(a, b)
        offset += a * b
        h = h @ w + theta[offset:offset + b]
        offset += b
        if i < len(sizes) - 2:
            h = np.maximum(h, 0.0)
    return h
