"""Tier 1: the codec round-trips exactly and rejects malformed records by field."""

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord

from fedbayes_flwr import codec
from fedbayes_flwr.algorithms.pvi import client as pvi_client
from fedbayes_flwr.algorithms.pvi import messages as pvi_messages
from fedbayes_flwr.algorithms.pvi import server as pvi_server
from fedbayes_flwr.inference import gaussian as G

KIND_TRAIN, KIND_REPLY, KIND_STATE = "pvi.train", "pvi.train.reply", "pvi.client-state"


def _request(diag=False):
    prior = G.from_moments(np.arange(3.0), np.ones(3) if diag else np.eye(3) * 2.0)
    state = pvi_server.init_server(prior, 2)._replace(server_round=6)
    return pvi_server.broadcast(state, 1)


@pytest.mark.parametrize("diag", [False, True])
def test_round_trip_is_exact(diag):
    msg = _request(diag)
    back = codec.decode(codec.encode(msg, KIND_TRAIN), KIND_TRAIN, msg)
    assert back.server_round == msg.server_round == 7
    assert back.accepted_round == msg.accepted_round
    for a, b in ((back.posterior.eta1, msg.posterior.eta1),
                 (back.posterior.eta2, msg.posterior.eta2)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)


def test_dotted_keys_and_schema_version():
    rd = codec.encode(_request(), KIND_TRAIN, {"action": "train", "round": 7})
    assert "pvi.train.posterior.eta1" in rd.array_records["arrays"]
    assert rd.config_records["config"]["schema-version"] == codec.SCHEMA_VERSION
    assert rd.config_records["config"]["pvi.train.server_round"] == 7
    assert rd.config_records["config"]["round"] == 7


def test_infinity_is_valid_only_where_the_template_allows_it():
    """Finiteness is a per-field rule (a PDMC event time may be +inf); NaN is never valid."""
    msg = pvi_messages.EvalReply(np.array([np.inf]))
    rd = codec.encode(msg, "t")
    with pytest.raises(codec.CodecError, match="term: non-finite"):
        codec.decode(rd, "t", msg)
    assert codec.decode(rd, "t", msg, allow_inf={"term"}).term[0] == np.inf
    with pytest.raises(codec.CodecError, match="term: non-finite"):
        codec.decode(codec.encode(pvi_messages.EvalReply(np.array([np.nan])), "t"), "t", msg,
                     allow_inf={"term"})


def _reply():
    return pvi_messages.ClientMessage(G.from_moments(np.zeros(3), np.eye(3)), 5, 1)


@pytest.mark.parametrize("mutate, field, reason", [
    (lambda rd: rd.array_records["arrays"].__setitem__(
        "pvi.train.reply.delta.eta1", Array(np.array([np.nan, 0.0, 0.0]))), "delta.eta1", "non-finite"),
    (lambda rd: rd.array_records["arrays"].__setitem__(
        "pvi.train.reply.delta.eta2", Array(np.zeros((2, 2)))), "delta.eta2", "shape"),
    (lambda rd: rd.array_records["arrays"].__setitem__(
        "pvi.train.reply.delta.eta1", Array(np.zeros(3, np.float32))), "delta.eta1", "dtype"),
    (lambda rd: rd.array_records["arrays"].__delitem__("pvi.train.reply.delta.eta2"),
     "delta.eta2", "missing"),
    (lambda rd: rd.config_records.__setitem__("config", ConfigRecord({"schema-version": 99})),
     "schema-version", "expected 1"),
])
def test_decode_names_the_bad_field(mutate, field, reason):
    rd = codec.encode(_reply(), KIND_REPLY)
    mutate(rd)
    with pytest.raises(codec.CodecError, match=reason) as err:
        codec.decode(rd, KIND_REPLY, _reply())
    assert err.value.field == field


def test_client_state_store_and_load():
    from flwr.app import RecordDict

    records = RecordDict()
    prior = G.from_moments(np.zeros(2), np.eye(2))
    assert codec.load_state(records, KIND_STATE, pvi_client.init_client(prior)) is None
    state = pvi_messages.ClientState(prior, G.add(prior, prior), 3)
    codec.save_state(records, KIND_STATE, state)
    back = codec.load_state(records, KIND_STATE, pvi_client.init_client(prior))
    assert back.pending_round == 3
    assert np.array_equal(back.pending.eta2, state.pending.eta2)
