"""Evaluation from the posterior interface only: predictive metrics, sample quality (W1, KSD),
the NUTS reference posterior and plots.
"""
