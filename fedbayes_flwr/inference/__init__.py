"""Shared inference algebra: Gaussian and exponential-family parameters, posteriors (the common
posterior interface), potentials with rate bounds, Gaussian VI against an effective prior, and
mean-field VB for exponential-family models. No Flower, no family protocol.
"""
