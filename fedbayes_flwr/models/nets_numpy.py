r"""Softmax networks in numpy: the summed negative log-likelihood, its gradient and its exact
second directional derivative, for a batch of parameter vectors (gradient-based samplers).

:class:`SoftmaxNetPotential` is ``U(theta) = -sum_n log softmax(f(x_n; theta))_{y_n}`` for the
network of :class:`fedbayes_flwr.models.bnn.BNNClassifier`, with the SAME parameter layout as
:meth:`~fedbayes_flwr.models.bnn.BNN.forward_tf`: layer by layer, the weight matrix
(``fan_in x fan_out``, row-major) then the bias; ReLU on the hidden layers; no hidden layer is
softmax (multinomial logistic) regression. Everything is numpy over ``K`` parameter rows at once
(``theta (K, d)``), with no TensorFlow: at decentralized HMC's sizes (``K`` of 8-16 chains, a
few hundred to 1,500 rows, 100 hidden units) TensorFlow's per-call cost would dominate.

**Gradient.** Back-propagation: ``delta_L = softmax(a_L) - onehot(y)`` and
``delta_{l-1} = (delta_l W_l^T) * 1[a_{l-1} > 0]``; ``dU/dW_l = h_{l-1}^T delta_l``,
``dU/db_l = sum_n delta_l``.

**Hessian quadratic form** ``v^T H(theta) v`` (:meth:`SoftmaxNetPotential.hess_quad`), exact
(Pearlmutter's R-operator, taken twice along ``v``). Write ``a_l(t)``, ``h_l(t)`` for the
network at ``theta + t v`` (``V_l``, ``c_l`` the parts of ``v`` for layer ``l``) and ``R``,
``R^2`` for the first and second derivatives in ``t`` at ``t = 0``. With ``h_0 = x`` fixed
(``R h_0 = R^2 h_0 = 0``),

    R a_l   = R h_{l-1} W_l + h_{l-1} V_l + c_l,
    R^2 a_l = R^2 h_{l-1} W_l + 2 R h_{l-1} V_l,
    R h_l = 1[a_l > 0] R a_l,   R^2 h_l = 1[a_l > 0] R^2 a_l

(ReLU is piecewise linear: its second derivative is zero wherever it is differentiable, i.e.
for almost every ``theta``, the convention of TensorFlow's gradient of ``relu``). With
``p_n = softmax(a_L(x_n))``, ``r_n = R a_L(x_n)`` and ``s_n = R^2 a_L(x_n)``,

    v^T H v = d^2/dt^2 U(theta + t v) |_{t=0}
            = sum_n [ r_n^T (diag p_n - p_n p_n^T) r_n + (p_n - onehot(y_n))^T s_n ].

For softmax regression ``s_n = 0`` and ``r_n = x_n^T V + c``: the closed form
``sum_n [sum_c p_nc r_nc^2 - (sum_c p_nc r_nc)^2]``. One Hessian quadratic form costs about two
forward passes; the forward pass at ``theta`` is cached (one entry), so a ``value``, ``grad``
or ``hess_quad`` at the ``theta`` of the previous call does not recompute it.

:class:`fedbayes_flwr.inference.potentials.DiagonalGaussian` is a diagonal Gaussian prior with the
same interface in ``O(d)`` per row (a dense ``d x d`` quadratic is 450 MB at a 64-100-10
network's 7,510 parameters).

References
----------
Bishop (2006), "Pattern Recognition and Machine Learning", Section 4.3.4 (multiclass logistic
regression: gradient and Hessian ``sum_n (diag p_n - p_n p_n^T) (x) x_n x_n^T``) and Section
5.3 (back-propagation); Pearlmutter (1994), "Fast Exact Multiplication by the Hessian", Neural
Computation 6(1), Section 3 (the R-operator); Kungurtsev, Cobb, Javidi & Jalaian (2023),
"Decentralized Bayesian Learning with Metropolis-Adjusted Hamiltonian Monte Carlo", Section 4
(softmax regression and a one-hidden-layer BNN on MNIST, whose energy term needs
``p^T (Hessian U_i) p``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class _Forward(NamedTuple):
    """The forward pass at ``theta (K, d)``: each layer's input ``h_{l-1}`` (the first is the
    data ``x (n, f)``, the others ``(K, n, fan_in)``), hidden pre-activations' ReLU masks, the
    output logits ``(K, n, C)`` and their log-sum-exp ``(K, n)``."""

    inputs: list
    masks: list
    logits: np.ndarray
    lse: np.ndarray


class SoftmaxNetPotential:
    """``U(theta) = -sum_n log softmax(f(x_n; theta))_{y_n}`` of a ReLU network with a softmax
    output (module docstring), over a batch of parameter rows.

    Parameters
    ----------
    x : array_like
        ``(n, f)`` inputs.
    y : array_like
        ``(n,)`` integer class labels in ``0 .. C - 1`` (floats holding integers are accepted).
    sizes : sequence of int
        Layer sizes ``(f, hidden..., C)``: :meth:`fedbayes_flwr.models.bnn.BNN.layer_sizes`.
        ``(f, C)`` is softmax regression.

    Attributes
    ----------
    dim : int
        Number of parameters, ``sum_l (fan_in + 1) fan_out``.
    """

    def __init__(self, x, y, sizes):
        self.x = np.ascontiguousarray(np.asarray(x, dtype=np.float64))
        if self.x.ndim != 2:
            raise ValueError(f"x must have shape (n, f), got {self.x.shape}")
        self.sizes = tuple(int(s) for s in sizes)
        if len(self.sizes) < 2 or any(s < 1 for s in self.sizes):
            raise ValueError(f"sizes must be (inputs, hidden..., classes), all >= 1, got {sizes}")
        if self.sizes[0] != self.x.shape[1]:
            raise ValueError(f"x has {self.x.shape[1]} features but sizes[0] = {self.sizes[0]}")
        labels = np.asarray(y, dtype=np.float64).reshape(-1)
        if labels.shape[0] != self.x.shape[0]:
            raise ValueError(f"y has {labels.shape[0]} rows, x has {self.x.shape[0]}")
        classes = self.sizes[-1]
        if np.any(labels != np.round(labels)) or np.any((labels < 0) | (labels >= classes)):
            raise ValueError(f"y must hold integer class labels in 0..{classes - 1}")
        self.y = labels.astype(np.int64)
        self.rows = np.arange(self.x.shape[0])
        self.dim = sum(a * b + b for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True))
        self._cache: tuple[np.ndarray, _Forward] | None = None

    # ---- layout ---------------------------------------------------------------------------
    def unpack(self, theta: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """``[(W_l (K, fan_in, fan_out), b_l (K, fan_out)), ...]`` views of ``theta (K, d)``."""
        theta = np.asarray(theta, dtype=np.float64)
        if theta.ndim != 2 or theta.shape[1] != self.dim:
            raise ValueError(f"theta must have shape (K, {self.dim}), got {theta.shape}")
        k = theta.shape[0]
        out, offset = [], 0
        for fan_in, fan_out in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            w = theta[:, offset:offset + fan_in * fan_out].reshape(k, fan_in, fan_out)
            offset += fan_in * fan_out
            out.append((w, theta[:, offset:offset + fan_out]))
            offset += fan_out
        return out

    # ---- forward pass ---------------------------------------------------------------------
    def _forward(self, theta: np.ndarray) -> _Forward:
        theta = np.asarray(theta, dtype=np.float64)
        if self._cache is not None:
            key, fwd = self._cache
            if key.shape == theta.shape and np.array_equal(key, theta):
                return fwd
        layers = self.unpack(theta)
        h = self.x
        inputs, masks = [], []
        for i, (w, b) in enumerate(layers):
            inputs.append(h)
            a = np.matmul(h, w) + b[:, None, :]  # (n, f) @ (K, f, o) broadcasts to (K, n, o)
            if i < len(layers) - 1:
                mask = a > 0
                masks.append(mask)
                h = np.maximum(a, 0.0)
            else:
                h = a
        top = h.max(axis=-1, keepdims=True)
        lse = np.log(np.sum(np.exp(h - top), axis=-1)) + top[..., 0]
        fwd = _Forward(inputs, masks, h, lse)
        self._cache = (theta.copy(), fwd)
        return fwd

    def _probs(self, fwd: _Forward) -> np.ndarray:
        return np.exp(fwd.logits - fwd.lse[..., None])

    def logits(self, theta: np.ndarray) -> np.ndarray:
        """The network's outputs at the potential's inputs, ``(K, n, C)``."""
        return self._forward(theta).logits

    # ---- the potential --------------------------------------------------------------------
    def value(self, theta: np.ndarray) -> np.ndarray:
        """``U`` at each row of ``theta (K, d)``, shape ``(K,)``."""
        fwd = self._forward(theta)
        return np.sum(fwd.lse - fwd.logits[:, self.rows, self.y], axis=1)

    def grad(self, theta: np.ndarray) -> np.ndarray:
        """``grad U`` at each row of ``theta (K, d)``, shape ``(K, d)`` (back-propagation)."""
        fwd = self._forward(theta)
        layers = self.unpack(theta)
        delta = self._probs(fwd)
        delta[:, self.rows, self.y] -= 1.0
        parts = []
        for i in range(len(layers) - 1, -1, -1):
            h = fwd.inputs[i]
            h_t = h.T if h.ndim == 2 else np.swapaxes(h, 1, 2)
            parts.append(delta.sum(axis=1))  # bias
            parts.append(np.matmul(h_t, delta).reshape(delta.shape[0], -1))  # weights
            if i > 0:
                delta = np.matmul(delta, np.swapaxes(layers[i][0], 1, 2)) * fwd.masks[i - 1]
        return np.concatenate(parts[::-1], axis=1)

    def hess_quad(self, theta: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``v^T (Hessian of U at theta) v`` for each row pair, shape ``(K,)``: exact
        (module docstring; almost everywhere for ReLU networks)."""
        fwd = self._forward(theta)
        layers = self.unpack(theta)
        directions = self.unpack(v)
        r_h = r2_h = None  # R h_{l-1}, R^2 h_{l-1}; zero for the data
        for i, ((w, _), (dw, db)) in enumerate(zip(layers, directions, strict=True)):
            r_a = np.matmul(fwd.inputs[i], dw) + db[:, None, :]
            r2_a = None
            if r_h is not None:
                r_a = r_a + np.matmul(r_h, w)
                r2_a = 2.0 * np.matmul(r_h, dw)
                if r2_h is not None:
                    r2_a = r2_a + np.matmul(r2_h, w)
            if i < len(layers) - 1:
                mask = fwd.masks[i]
                r_h = np.where(mask, r_a, 0.0)
                r2_h = None if r2_a is None else np.where(mask, r2_a, 0.0)
        p = self._probs(fwd)
        pr = np.sum(p * r_a, axis=-1)
        quad = np.sum(np.sum(p * r_a**2, axis=-1) - pr**2, axis=1)
        if r2_a is not None:
            resid = p
            resid[:, self.rows, self.y] -= 1.0
            quad = quad + np.sum(resid * r2_a, axis=(1, 2))
        return quad
