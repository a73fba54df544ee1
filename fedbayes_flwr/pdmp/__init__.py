"""Piecewise-deterministic Monte Carlo: Zig-Zag and bouncy particle samplers, federated.

:mod:`.sampler` (event times by exact inversion and thinning, the workers' proposals, the server's
minimum, discretisation) and :mod:`.potentials` (gradients and rate bounds). numpy only.
"""
