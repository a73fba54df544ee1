"""PVI's server-side step search, guard and bookkeeping on hand-made inputs (issue 31: mutants
of ``algorithms/pvi/server.py`` and ``step.py`` that the rest of the suite left alive).

Every expectation is computed by hand in the test (closed-form Gaussian KL, the Armijo condition
written out, exact round counters), never with the module's own helpers. The model is one scalar
parameter with prior ``N(0, 1)`` (natural parameters ``eta1 = 0``, ``eta2 = -1/2``, diagonal).
With zero deltas every candidate posterior equals the prior, ``KL(q || p) = 0`` and the
candidates' free energies are exactly the expected log-likelihoods the test sends.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.algorithms.base import Rejection
from fedbayes_flwr.algorithms.pvi import server as srv
from fedbayes_flwr.algorithms.pvi import step as S
from fedbayes_flwr.algorithms.pvi.config import PVIConfig
from fedbayes_flwr.algorithms.pvi.messages import PHASE_SEARCH, CandidateReply, ClientMessage
from fedbayes_flwr.inference.gaussian import NaturalGaussian

PRIOR = NaturalGaussian(np.array([0.0]), np.array([-0.5]))


def _searching(config: PVIConfig, num_clients: int = 1, delta_eta2: float = 0.0):
    """A server-held state in its first search exchange, client 0 having sent the delta
    ``(0, delta_eta2)``."""
    state = srv.init_server(PRIOR, num_clients, config)
    deltas = NaturalGaussian(np.zeros((num_clients, 1)), np.zeros((num_clients, 1)))
    deltas.eta2[0, 0] = delta_eta2
    received = np.zeros(num_clients, dtype=bool)
    received[0] = True
    return state._replace(deltas=deltas, received=received, phase=PHASE_SEARCH, search=0)


def _kl_to_std_normal(var: float) -> float:
    """``KL(N(0, var) || N(0, 1)) = (var - 1 - ln var) / 2`` (closed form)."""
    return 0.5 * (var - 1.0 - np.log(var))


def test_unit_step_taken_without_guard_or_rule_diagnostic():
    # values = ells (all candidates are the prior): f0 = 0, the unit step's 1 >= floor, so
    # "largest" takes index 0 in exchange 0: neither a guard nor a step-rule message
    config = PVIConfig()
    state, info = srv.search_step(_searching(config), [(0, CandidateReply(
        np.array([0.0, 1.0, 0.0, 0.0, 0.0])))], config, 1)
    assert info.diagnostics["pvi_step"] == 1.0
    assert "pvi_guard" not in info.diagnostics
    assert "pvi_rule" not in info.diagnostics
    assert state.free_energy == 1.0
    assert state.recent == (1.0,)  # window 5: the round's free energy joins it
    assert info.updates == 1


def test_improper_unit_step_counts_as_a_fall():
    # delta eta2 = +0.75: q(s) has eta2 = -0.5 + 0.75 s, improper at s = 1 (eta2 = +0.25),
    # variance 1 / (-2 eta2) = 4 at s = 1/2. ells [0, 0, 1, 0, 0]: F(1/2) = 1 - KL(N(0,4)||N(0,1))
    # = 1 - (3 - ln 4) / 2 = 0.193 >= f0 = 0, so the search backtracks to s = 1/2 and, the unit
    # step being improper (free energy -inf, below the floor), reports the guard
    config = PVIConfig()
    state, info = srv.search_step(_searching(config, delta_eta2=0.75), [(0, CandidateReply(
        np.array([0.0, 0.0, 1.0, 0.0, 0.0])))], config, 1)
    assert info.diagnostics["pvi_step"] == 0.5
    assert "pvi_guard" in info.diagnostics and "pvi_rule" not in info.diagnostics
    assert state.free_energy == pytest.approx(1.0 - _kl_to_std_normal(4.0), rel=1e-12)
    assert state.posterior.eta2[0] == pytest.approx(-0.125, rel=1e-15)


def test_window_zero_keeps_no_free_energies():
    # pvi.nonmonotone = 0: no window; the finite free energy 1 must not be kept
    config = PVIConfig(nonmonotone=0)
    state, _ = srv.search_step(_searching(config), [(0, CandidateReply(
        np.array([0.0, 1.0, 0.0, 0.0, 0.0])))], config, 1)
    assert state.free_energy == 1.0
    assert state.recent == ()


def test_incomplete_round_keeps_no_nan_in_window():
    # one of two clients answered: the free energy is unknown (NaN) and stays out of the window
    config = PVIConfig()
    state, info = srv.search_step(_searching(config, num_clients=2), [
        (0, CandidateReply(np.array([0.0, 1.0, 0.0, 0.0, 0.0]))),
        (1, Rejection(1, "expected_log_likelihood", "lost"))], config, 2)
    assert info.diagnostics["pvi_step"] == 1.0
    assert np.isnan(state.free_energy)
    assert state.recent == ()


def test_anderson_floor_is_relative_to_abs_f0():
    # guard tolerance 0.5, f0 = -10: the floor is -10 - 0.5 * max(1, 10) = -15. History: factors
    # 0, deltas a then 2a (a = (0.1, 0.05)): gamma = (a . 2a) / (a . a) = 2 (ridge 1e-10), so
    # t_AA = 0 + 2a - 2a = 0 up to 2e-10 a and q_AA is the prior (KL ~ 1e-20). Its free energy
    # -12 >= -15 is accepted (a floor of -10 - 0.5 would refuse it)
    config = PVIConfig(acceleration="anderson", guard_tolerance=0.5)
    state = _searching(config)
    rows = config.anderson_memory + 1
    f = np.zeros((rows, 1, 1))
    d1, d2 = np.zeros((rows, 1, 1)), np.zeros((rows, 1, 1))
    d1[-2], d2[-2], d1[-1], d2[-1] = 0.1, 0.05, 0.2, 0.1
    history = S.History(NaturalGaussian(f, f.copy()), NaturalGaussian(d1, d2), 2)
    state = state._replace(history=history)
    state, info = srv.search_step(state, [(0, CandidateReply(
        np.array([-10.0, -10.0, -10.0, -10.0, -10.0, -12.0])))], config, 1)
    assert info.diagnostics["pvi_anderson"] is True
    assert info.diagnostics["pvi_step"] == "anderson"
    assert state.free_energy == pytest.approx(-12.0, abs=1e-8)


def test_anderson_two_differences_solves_the_square_system():
    # three rows (scaled 1e-6: the ridge must scale with the Gram matrix, not add an absolute
    # 1e-10): residuals f = (1,0), (0,1), (1,1); dF = [[-1, 1], [1, 0]] (columns f1-f0, f2-f1),
    # dF gamma = f2 gives gamma = (1, 2). Factors t = (0,0), (1,0), (0,2): dT + dD =
    # (1,0)+(-1,1) = (0,1) and (-1,2)+(1,0) = (0,2); t_AA = t2 + f2 - 1*(0,1) - 2*(0,2)
    # = (0,2) + (1,1) - (0,5) = (1, -2), times 1e-6. Ridge error ~1e-10 relative
    e = 1e-6
    t = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]]) * e
    d = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]) * e
    history = S.History(NaturalGaussian(t[:, None, :1], t[:, None, 1:]),
                        NaturalGaussian(d[:, None, :1], d[:, None, 1:]), 3)
    aa = S.anderson(history)
    assert aa is not None
    np.testing.assert_allclose(aa.eta1[0], [1.0 * e], rtol=1e-7)
    np.testing.assert_allclose(aa.eta2[0], [-2.0 * e], rtol=1e-7)


def test_safe_rule_chord_slope_is_true_division():
    # f0 = 0, steps (1, 1/2, 1/4, 1/8), values (1.1, 0.55, 0.2, 0.3): chord slope
    # g = 0.3 / 0.125 = 2.4; Armijo F(s) >= 0.5 s g: 1.1 >= 1.2 no, 0.55 >= 0.6 no,
    # 0.2 >= 0.3 no, 0.3 >= 0.15 yes; margins all hold (every candidate acceptable) -> index 3.
    # (a slope of 2 = 0.3 // 0.125 would pass 1.1 >= 1.0 and take index 0)
    steps = np.array([1.0, 0.5, 0.25, 0.125])
    values = np.array([1.1, 0.55, 0.2, 0.3])
    assert S.choose(0.0, values, 1e-6, "safe", steps, 0.5, True, False) == 3


def test_safe_rule_armijo_uses_the_increase_over_f0():
    # the same profile shifted by f0 = 10: F(s) - F(0) as above, so again only s = 1/8 passes
    # Armijo (slope (10.3 - 10) / 0.125 = 2.4) -> index 3
    steps = np.array([1.0, 0.5, 0.25, 0.125])
    values = 10.0 + np.array([1.1, 0.55, 0.2, 0.3])
    assert S.choose(10.0, values, 1e-6, "safe", steps, 0.5, True, False) == 3


def test_sync_collect_counts_the_round():
    config = PVIConfig()
    state = srv.init_server(PRIOR, 1, config)._replace(server_round=4)
    delta = NaturalGaussian(np.array([0.5]), np.array([-0.25]))
    state, info = srv.collect_deltas(state, [(0, ClientMessage(delta, 3, 5))], config)
    assert state.server_round == 5
    assert state.search == 0 and state.phase == PHASE_SEARCH
    assert info.updates == 0


def test_async_rejection_is_one_update():
    config = PVIConfig(schedule="asynchronous")
    state = srv.init_server(PRIOR, 1, config)._replace(server_round=4)
    reason = Rejection(0, "delta", "undecodable")
    state, info = srv.collect_deltas(state, [(0, reason)], config)
    assert state.server_round == 5
    assert info.updates == 1
    assert info.rejected == (reason,)


def test_server_step_rejection_does_not_stop_later_replies():
    # client 0's reply is a Rejection; client 1's delta (1, -1/2) is still applied:
    # posterior = prior + delta = (1, -1); round 5 -> 6
    state = srv.init_server(PRIOR, 2)._replace(server_round=5)
    delta = NaturalGaussian(np.array([1.0]), np.array([-0.5]))
    new, info = srv.server_step(state, [(0, Rejection(0, "delta", "lost")),
                                        (1, ClientMessage(delta, 10, 6))])
    assert new.server_round == 6
    assert info.accepted == (1,)
    assert len(info.rejected) == 1
    np.testing.assert_array_equal(new.posterior.eta1, [1.0])
    np.testing.assert_array_equal(new.posterior.eta2, [-1.0])


# --- mutants of the fresh sweep (seed 0, population 1,513) ------------------------------------

def test_an_odd_number_of_plain_steps_is_searched_in_full():
    # pvi.line-search-steps = 3: candidates [q, s = 1, 1/2, 1/4]; ells [0, -1, -1, 1] (all
    # candidates are the prior, so F = ell): only s = 1/4 is at least f0 = 0 (the floor is
    # f0 - 1e-3 max(1, |f0|) = -1e-3 for the default tolerance, which -1 misses), so exchange 0
    # takes it. Mutant `1 + steps` -> `1 | steps` (1 | 3 = 3) would look at s = 1 and 1/2 only.
    config = PVIConfig(line_search_steps=3, step_rule="largest")
    state, info = srv.search_step(_searching(config), [(0, CandidateReply(
        np.array([0.0, -1.0, -1.0, 1.0])))], config, 1)
    assert info.diagnostics["pvi_step"] == 0.25
    assert state.free_energy == 1.0
    # the 'safe' rule gets the three steps too: ells [0, 0.9, 0.55, 0.5], chord slope
    # 0.5 / 0.25 = 2, Armijo F(s) >= 0.5 s 2 = s: 0.9 >= 1 no, 0.55 >= 0.5 yes, 0.5 >= 0.25 yes;
    # the best of those is s = 1/2 (the mutant hands choose two steps for three values)
    config = PVIConfig(line_search_steps=3, step_rule="safe")
    state, info = srv.search_step(_searching(config), [(0, CandidateReply(
        np.array([0.0, 0.9, 0.55, 0.5])))], config, 1, exact_free_energy=False)
    assert info.diagnostics["pvi_step"] == 0.5
    assert state.free_energy == 0.55


def test_anderson_is_recognised_from_a_string_built_at_run_time():
    # A config value read from TOML / the command line is not an interned literal: the
    # Anderson candidate must still be added (1 current + 4 plain + 1 Anderson = 6 candidates,
    # the last one improper-flagged since the history is empty). Mutant `==` -> `is` drops it.
    name = "".join(["ander", "son"])
    assert name == "anderson"
    config = PVIConfig(acceleration=name)
    cands = srv.candidates(_searching(config), config)
    assert len(cands.steps) == 6 and np.isnan(cands.steps[-1])
    assert not cands.proper[-1]  # no history yet: the Anderson slot is not a candidate


def test_an_unknown_schedule_is_refused_by_select_clients():
    # select_clients's own contract: an unknown schedule raises (mutant `== "sequential"` ->
    # `<= "sequential"` would treat "parallel" < "sequential" as the sequential schedule)
    with pytest.raises(ValueError, match="unknown schedule 'parallel'"):
        srv.select_clients(0, 1, 3, "parallel")
    assert srv.select_clients(0, 1, 3, "synchronous") == [0, 1, 2]


def test_the_first_broadcast_is_for_round_one():
    # Flower's rounds are 1-based: a fresh server's first message is for round 1 and carries
    # no accepted round (mutant: the server starting at round 1, so its first message says 2)
    state = srv.init_server(PRIOR, 2)
    assert state.server_round == 0
    message = srv.broadcast(state, 1)
    assert message.server_round == 1 and message.accepted_round == -1  # commit.NO_ROUND


def test_safe_rule_in_the_search_sees_every_plain_step():
    # test_safe_rule_chord_slope_is_true_division's profile through search_step (Monte Carlo
    # free energies: no unit-step exception): ells [f0 = 0, 1.1, 0.55, 0.2, 0.3] for steps
    # (1, 1/2, 1/4, 1/8) -> chord slope 2.4, only s = 1/8 passes Armijo -> step 0.125. Mutant
    # `steps[1:1 + 4]` -> `steps[1:1 - 4]` hands choose the steps (1,) only: slope 0.3 / 1,
    # and 1.1 >= 0.15 takes s = 1.
    config = PVIConfig(step_rule="safe")
    state, info = srv.search_step(_searching(config), [(0, CandidateReply(
        np.array([0.0, 1.1, 0.55, 0.2, 0.3])))], config, 1, exact_free_energy=False)
    assert info.diagnostics["pvi_step"] == 0.125
    assert state.free_energy == 0.3


def test_a_smaller_best_step_is_reported_as_the_rule_not_the_guard():
    # step rule 'best', ells [f0 = 0, 0.5, 1.0, 0.2, 0.1] for steps (1, 1/2, 1/4, 1/8): every
    # candidate is acceptable (>= floor -1e-3) and s = 1/2 has the highest free energy, so the
    # step is 0.5 by the rule, and the unit step (0.5 > floor) did NOT lower the free energy:
    # a 'pvi_rule' diagnostic, no 'pvi_guard'. Mutant `values[1] >= floor` -> `== floor`
    # reports the guard.
    config = PVIConfig(step_rule="best")
    state, info = srv.search_step(_searching(config), [(0, CandidateReply(
        np.array([0.0, 0.5, 1.0, 0.2, 0.1])))], config, 1)
    assert info.diagnostics["pvi_step"] == 0.5
    assert info.diagnostics["pvi_rule"] == "step rule 'best' took 0.5"
    assert "pvi_guard" not in info.diagnostics
    assert state.free_energy == 1.0


def test_nonmonotone_fallback_never_takes_a_step_above_the_last():
    # Grippo et al. (1986): the fallback takes the largest candidate step <= the last step taken
    # whose free energy is >= the lowest of the recent rounds. Last step 1/2, window (-5,),
    # every candidate at 1 >= -5: steps (1, 1/2, 1/4, 1/8) -> index 1 (s = 1/2, not s = 1).
    # Mutant `last * (1 + 1e-12)` -> `last * (2 + 1e-12)` admits s = 1.
    config = PVIConfig(damping="auto", nonmonotone=3)
    state = srv.init_server(PRIOR, 1, config)._replace(last_step=0.5, recent=(-5.0,))
    steps = np.array([1.0, 0.5, 0.25, 0.125])
    assert srv.nonmonotone_index(state, config, np.ones(4), steps) == 1
    # a last step below every candidate: none qualifies
    assert srv.nonmonotone_index(state._replace(last_step=0.1), config, np.ones(4), steps) is None


def test_check_delta_refuses_a_shorter_or_longer_delta_naming_the_field():
    # a 2-parameter posterior; deltas with 1 and 3 coordinates are refused on eta1 with both
    # shapes named (mutant `!=` -> `>`: (1,) > (2,) is False, the short delta slips through)
    post = NaturalGaussian(np.zeros(2), np.full(2, -0.5))
    for n in (1, 3):
        bad = NaturalGaussian(np.zeros(n), np.zeros(2))
        assert srv.check_delta(post, bad) == ("delta.eta1", f"shape ({n},), expected (2,)")
    short_eta2 = NaturalGaussian(np.zeros(2), np.zeros(1))
    assert srv.check_delta(post, short_eta2) == ("delta.eta2", "shape (1,), expected (2,)")
    assert srv.check_delta(post, NaturalGaussian(np.zeros(2), np.zeros(2))) is None
