"""Restarts are visible (issue 32, item 4): every answer names the server's run
(``X-Server-Epoch``); a client whose episodes died with an earlier run gets
:class:`ServerRestartedError` (410), a typo keeps its 404, and new episodes just work. With a
journal, ids of an earlier run are told from typos even by a fresh client."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from jaxsampler.episodes.codec import packb
from jaxsampler.host_envs.external import EpisodeStateError, ExternalEnv, UnknownEpisodeError
from jaxsampler.offline import StepJournal
from jaxsampler.serving import PolicyClient, PolicyServer, ServerRestartedError
from tests.fakes import ACT, OBS, PollLoop, answer, http_request, wait_finished


def o(x: float) -> np.ndarray:
    return np.full(3, x, np.float32)


class Served:
    """A server on ``port`` (0: a free one) with its poll loop."""

    def __init__(self, port: int = 0, journal=None, **kw):
        env = ExternalEnv(OBS, ACT, max_wait_s=0.005, episode_timeout_s=30.0, journal=journal)
        self.server = PolicyServer(env, port=port, **kw)
        self.loop = PollLoop(self.server)
        self.port = int(self.server.address.rsplit(":", 1)[1])

    def close(self) -> None:
        self.loop.close()
        self.server.close()


def raw(server, method: str, path: str, body=None, headers=None):
    status, head, data = http_request(server, method, path, body, headers)
    return status, head.get("X-Server-Epoch"), data


def test_every_answer_carries_the_epoch_errors_included():
    s = Served(token="t0k")
    try:
        epoch = s.server.epoch
        assert re.fullmatch(r"[0-9a-f]{16}", epoch)
        auth = {"Authorization": "Bearer t0k"}
        answers = [
            raw(s.server, "GET", "/health", headers=auth),
            raw(s.server, "GET", "/info", headers=auth),
            raw(s.server, "GET", "/weights", headers=auth),  # 404 NoWeights
            raw(s.server, "GET", "/nope", headers=auth),  # 404
            raw(s.server, "PUT", "/get_action", headers=auth),  # 405
            raw(s.server, "POST", "/get_action", b"\x01", auth),  # 400
            raw(s.server, "GET", "/health"),  # 401
            raw(s.server, "POST", "/start_episode", packb({}), auth),  # 200
        ]
        assert [a[0] for a in answers] == [200, 200, 404, 404, 405, 400, 401, 200]
        assert {a[1] for a in answers} == {epoch}
        another = Served()
        another.close()
        assert another.server.epoch != epoch  # a fresh draw per server
    finally:
        s.close()


def test_a_stale_epoch_is_refused_only_for_requests_naming_episodes():
    s = Served()
    try:
        stale = {"X-Server-Epoch": "0" * 16}
        status, _, data = raw(s.server, "POST", "/start_episode", packb({"episode_id": "a"}))
        assert status == 200
        msg = packb({"episode_id": "a", "observation": o(1)})
        status, _, data = raw(s.server, "POST", "/get_action", msg, stale)
        assert status == 410 and json.loads(data)["error"] == "ServerRestartedError"
        assert "restarted" in json.loads(data)["message"]
        status, _, _ = raw(s.server, "POST", "/batch", packb({"commands": []}), stale)
        assert status == 410
        assert raw(s.server, "POST", "/start_episode", packb({}), stale)[0] == 200
        assert raw(s.server, "GET", "/health", headers=stale)[0] == 200
    finally:
        s.close()


def test_a_restart_on_the_same_port_is_reported_and_new_episodes_work():
    first = Served()
    c = PolicyClient(f"http://127.0.0.1:{first.port}", backoff_s=0.01)
    eid = c.start_episode()
    other = c.start_episode()
    assert c.get_action(eid, o(1)) == answer(o(1))
    assert c.get_action(other, o(1)) == answer(o(1))
    old_epoch = c.server_epoch
    assert old_epoch == first.server.epoch
    c.log_returns(eid, 1.0)
    first.close()
    second = Served(port=first.port)
    try:
        with pytest.raises(ServerRestartedError) as info:
            c.get_action(eid, o(2))
        assert info.value.status == 410
        assert info.value.deferred_returns == [  # type: ignore[attr-defined]
            {"episode_id": eid, "reward": 1.0, "info": None}
        ]
        assert c.server_epoch == second.server.epoch != old_epoch
        with pytest.raises(ServerRestartedError):  # every episode of the old run
            c.end_episode(other, o(2))
        with pytest.raises(UnknownEpisodeError):  # a typo stays a typo
            c.get_action("typo", o(2))
        new = c.start_episode()
        assert c.get_action(new, o(3)) == answer(o(3))
        c.end_episode(new, o(4))
        wait_finished(second.server.env, [new])
        assert len(second.loop.steps[new]) == 2
        assert eid not in second.loop.steps
    finally:
        c.close()
        second.close()


def test_with_a_journal_ids_of_an_earlier_run_are_410_and_not_reused(tmp_path):
    path = tmp_path / "journal"
    journal = StepJournal(path)
    first = Served(journal=journal)
    c = PolicyClient(first.server.address)
    c.start_episode("old")
    assert c.get_action("old", o(1)) == answer(o(1))
    c.close()
    first.close()
    journal.close()
    journal = StepJournal(path)
    second = Served(journal=journal)
    try:
        fresh = PolicyClient(second.server.address)  # a restarted simulator: no epoch yet
        with pytest.raises(ServerRestartedError, match="before this server restarted"):
            fresh.get_action("old", o(2))
        with pytest.raises(UnknownEpisodeError):
            fresh.get_action("typo", o(2))
        with pytest.raises(EpisodeStateError, match="ran before the server restarted"):
            fresh.start_episode("old")
        # the opt-in does not reuse a journaled id: recovery finds stored steps by id
        with pytest.raises(EpisodeStateError, match="never reuses an id"):
            fresh.start_episode("old", allow_reuse=True)
        assert fresh.get_action(fresh.start_episode(), o(3)) == answer(o(3))
        fresh.close()
    finally:
        second.close()
        journal.close()


def test_a_finished_id_is_refused_unless_reuse_is_asked_for(served):
    server, loop, _ = served
    c = PolicyClient(server.address)
    c.start_episode("x")
    c.end_episode("x", o(1))
    wait_finished(server.env, ["x"])
    with pytest.raises(EpisodeStateError, match=r"allow_reuse=True"):
        c.start_episode("x")
    assert c.start_episode("x", allow_reuse=True) == "x"
    assert c.get_action("x", o(2)) == answer(o(2))
    c.end_episode("x", o(3))
    c.close()
