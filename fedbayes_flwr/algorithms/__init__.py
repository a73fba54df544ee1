"""Algorithm bundles (one module per family) and the registry of names users pass.

Import :mod:`fedbayes_flwr.algorithms.registry` for the table and
:mod:`fedbayes_flwr.algorithms.base` for the shared types; this package imports no family
itself, so the generic engines never depend on one.
"""
