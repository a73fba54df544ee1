"""The PVI baselines as presets of the PVI bundle: Bayesian committee machines (same and split
prior), streaming VB (with and without deletion), global VI (one client, and federated).

References
----------
Ashman et al. (2022), "Partitioned Variational Inference: A Framework for Probabilistic Federated
Learning", Section 3 (the baselines as special cases of PVI).
"""

from __future__ import annotations


# ---------------------------------------------------------------------------- presets
def _bcm(cavity):
    def preset(c):
        return c.replace(num_rounds=1).with_section(schedule="synchronous", damping=1.0,
                                                     server_damping=1.0, cavity=cavity,
                                                     guard=False, acceleration="none")
    return preset


def _streaming(c):
    return c.replace(num_rounds=c.num_clients).with_section(
        schedule="sequential", damping=1.0, server_damping=1.0, cavity="no-deletion",
        guard=False, acceleration="none")


def _streaming_no_deletion(c):
    return c.with_section(schedule="sequential", damping=1.0, server_damping=1.0,
                          cavity="no-deletion", guard=False, acceleration="none")


def _global_vi(c):  # one client holding all rows: damping would only slow the fit down
    return c.replace(num_clients=1).with_section(schedule="synchronous", damping=1.0,
                                                 server_damping=1.0)


def _global_vi_federated(c):
    return c.with_section(schedule="synchronous", damping=1.0, server_damping=1.0,
                          local_optimiser="fixed-point", fixed_point_iterations=1, guard=False,
                          acceleration="none")


def with_dp_plan(preset):
    """``preset`` (None: none), then a DP run's ``dp-rounds`` filled in from ``num-rounds`` when
    it is 0, so clients calibrate their noise for the rounds the run plans (and a resumed or
    extended run keeps that noise). A run without DP is left exactly as ``preset`` leaves it."""
    def planned(c):
        c = preset(c) if preset is not None else c
        if c.section.dp != "none" and c.section.dp_rounds == 0:
            c = c.with_section(dp_rounds=c.num_rounds)
        return c
    return planned


PRESETS = {
    "pvi": (None, "PVI: clients send damped natural-parameter deltas of their factors t_k"),
    "global-vi": (_global_vi, "the same model on the pooled data (M = 1): the reference"),
    "global-vi-federated": (_global_vi_federated,
                            "global VI's dynamics federated: one natural-gradient step per "
                            "client per round (Section 2.5)"),
    "bcm-same": (_bcm("same-prior"), "Bayesian committee machine, same prior, one shot"),
    "bcm-split": (_bcm("split-prior"), "Bayesian committee machine, split prior p^(1/M)"),
    "vcl": (_streaming, "one sequential pass, each posterior the next prior"),
    "streaming-vb": (_streaming, "one sequential pass, each posterior the next prior"),
    "streaming-vb-no-deletion": (_streaming_no_deletion,
                                 "sequential passes without deleting old factors "
                                 "(over-confident)"),
}
