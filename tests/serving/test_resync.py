"""Resyncing sequence numbers after a :class:`SequenceError` (issue 32, retries):
``PolicyClient.resync(episode_id)`` learns the server's next expected number (``GET
/sequence``), says whether the call that got no answer ran, and the client continues from
there; the sampler (the test's poll loop) sees each step once."""

from __future__ import annotations

import json

import pytest

from jaxsampler.host_envs.external import UnknownEpisodeError
from jaxsampler.serving import PolicyClient, SequenceError
from tests.fakes import http_request, wait_finished
from tests.serving.test_retries import AGENT, LosingProxy, o, raw


def test_after_an_unanswered_call_that_ran_resync_continues_without_repeating_it(served):
    server, loop, _ = served
    proxy = LosingProxy(server.address)
    c = PolicyClient(proxy.address, retries=1, backoff_s=0.0)
    eid = c.start_episode()
    proxy.lose, proxy.lose_path = 10, b"POST /log_action"  # every try loses its answer
    with pytest.raises(ConnectionError):
        c.log_action(eid, o(1), 1)  # it ran (seq 1), but no answer came back
    proxy.lose = 0
    with pytest.raises(SequenceError, match=r"resync"):
        c.log_action(eid, o(2), 0)  # number 1 again, another request
    report = c.resync(eid)
    assert report == {"episode_id": eid, "last": 1, "next": 2, "unanswered_ran": True}
    c.log_action(eid, o(2), 0)  # now number 2
    c.end_episode(eid, o(3))
    wait_finished(server.env, [eid])
    assert [float(s[0][AGENT][0]) for s in loop.steps[eid]] == [1.0, 2.0, 3.0]  # once each
    c.close()
    proxy.close()


def test_resync_says_when_nothing_unanswered_ran(served):
    server, loop, _ = served
    c = PolicyClient(server.address)
    eid = c.start_episode()
    c.log_action(eid, o(1), 1)
    assert c.resync(eid) == {"episode_id": eid, "last": 1, "next": 2, "unanswered_ran": False}
    c.end_episode(eid, o(2))
    c.close()


def test_a_second_client_of_the_same_id_adopts_an_episode_and_its_retries_are_safe(served):
    server, loop, _ = served
    first = PolicyClient(server.address, client_id="sim")
    eid = first.start_episode()
    first.log_action(eid, o(1), 1)
    proxy = LosingProxy(server.address, lose=1, lose_path=b"POST /end_episode")
    second = PolicyClient(proxy.address, client_id="sim", backoff_s=0.0)  # a restarted simulator
    assert second.resync(eid)["next"] == 2
    second.end_episode(eid, o(2))  # numbered: its lost answer is retried and replayed
    assert len(proxy.lost) == 1
    wait_finished(server.env, [eid])
    assert [float(s[0][AGENT][0]) for s in loop.steps[eid]] == [1.0, 2.0]
    for c in (first, second):
        c.close()
    proxy.close()


def test_resync_refuses_what_it_cannot_do(served):
    server, _, _ = served
    c = PolicyClient(server.address)
    with pytest.raises(UnknownEpisodeError):
        c.resync("never-started")
    with pytest.raises(ValueError, match="retries"):
        PolicyClient(server.address, retries=0).resync("x")
    for query in ("", "?episode_id=a&episode_id=b"):
        status, _, data = http_request(server, "GET", "/sequence" + query)
        assert status == 400 and "episode_id" in json.loads(data)["message"]
    # Another client's episode is not reported as this one's.
    assert raw(server, "/start_episode", {"episode_id": "theirs", "seq": 0}, "them")[0] == 200
    other = PolicyClient(server.address, client_id="someone-else")
    assert other.resync("theirs")["last"] is None
    c.close()
