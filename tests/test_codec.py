"""Tier 1: the codec round-trips exactly and rejects malformed records by field."""

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord

from fedbayes_flwr import codec, pvi
from fedbayes_flwr import gaussian as G


def _request(diag=False):
    prior = G.from_moments(np.arange(3.0), np.ones(3) if diag else np.eye(3) * 2.0)
    return pvi.TrainRequest(pvi.broadcast(pvi.init_server(prior, 2), 1, 7), pvi.PVIConfig())


@pytest.mark.parametrize("diag", [False, True])
def test_round_trip_is_exact(diag):
    msg = _request(diag)
    back = codec.decode(codec.encode(msg, pvi.KIND_TRAIN), pvi.KIND_TRAIN, msg)
    assert back.config == msg.config
    assert back.message.server_round == msg.message.server_round
    for a, b in ((back.message.posterior.eta1, msg.message.posterior.eta1),
                 (back.message.posterior.eta2, msg.message.posterior.eta2),
                 (back.message.seed, msg.message.seed)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)


def test_dotted_keys_and_schema_version():
    rd = codec.encode(_request(), pvi.KIND_TRAIN)
    assert "pvi.train.message.posterior.eta1" in rd.array_records["arrays"]
    assert rd.config_records["config"]["schema-version"] == codec.SCHEMA_VERSION
    assert rd.config_records["config"]["pvi.train.config.vi.steps"] == 1000


def _reply():
    return pvi.ClientMessage(G.from_moments(np.zeros(3), np.eye(3)), 5, 1)


@pytest.mark.parametrize("mutate, field, reason", [
    (lambda rd: rd.array_records["arrays"].__setitem__(
        "pvi.reply.delta.eta1", Array(np.array([np.nan, 0.0, 0.0]))), "delta.eta1", "non-finite"),
    (lambda rd: rd.array_records["arrays"].__setitem__(
        "pvi.reply.delta.eta2", Array(np.zeros((2, 2)))), "delta.eta2", "shape"),
    (lambda rd: rd.array_records["arrays"].__setitem__(
        "pvi.reply.delta.eta1", Array(np.zeros(3, np.float32))), "delta.eta1", "dtype"),
    (lambda rd: rd.array_records["arrays"].__delitem__("pvi.reply.delta.eta2"),
     "delta.eta2", "missing"),
    (lambda rd: rd.config_records.__setitem__("config", ConfigRecord({"schema-version": 99})),
     "schema-version", "expected 1"),
])
def test_decode_names_the_bad_field(mutate, field, reason):
    rd = codec.encode(_reply(), pvi.KIND_REPLY)
    mutate(rd)
    with pytest.raises(codec.CodecError, match=reason) as err:
        codec.decode(rd, pvi.KIND_REPLY, _reply())
    assert err.value.field == field


def test_client_state_store_and_load():
    from flwr.app import RecordDict

    records = RecordDict()
    prior = G.from_moments(np.zeros(2), np.eye(2))
    assert codec.load_state(records, pvi.KIND_STATE, pvi.init_client(prior)) is None
    state = pvi.ClientState(prior, G.add(prior, prior), 3)
    codec.save_state(records, pvi.KIND_STATE, state)
    back = codec.load_state(records, pvi.KIND_STATE, pvi.init_client(prior))
    assert back.pending_round == 3
    assert np.array_equal(back.pending.eta2, state.pending.eta2)
