"""A retried ``/batch`` is run once (issue 32, retries): a batch with a request id
(``POST /batch?id=...``) whose answer was lost and which is sent again gets the first
answer replayed, and the sampler (the test's poll loop) sees each step and reward once.
The same batch without an id runs twice (the reference: what an id prevents)."""

from __future__ import annotations

import json

import pytest

from jaxsampler.episodes.codec import packb, unpackb
from jaxsampler.serving import PolicyClient
from jaxsampler.serving.protocol import SequenceError
from jaxsampler.serving.sequence import BatchIds, RequestInProgress
from tests.fakes import http_request, wait_finished
from tests.serving.test_retries import AGENT, LosingProxy, body_of, o, raw, rewards_of


def batch(server, body: bytes, query: str = "", client_id: str = "me") -> tuple[int, bytes]:
    status, _, data = http_request(
        server, "POST", "/batch" + query, body, {"X-Client-Id": client_id}
    )
    return status, data


def steps_body(eid: str, xs: list[float]) -> bytes:
    return packb(
        {
            "commands": [
                {"command": "log_action", "episode_id": eid, "observation": o(x), "action": 1}
                for x in xs
            ]
        }
    )


@pytest.mark.parametrize("query", ["?id=b-1", ""])
def test_a_batch_sent_twice_stores_its_steps_once_with_an_id(served, query):
    server, loop, _ = served
    assert raw(server, "/start_episode", {"episode_id": "e"})[0] == 200
    body = steps_body("e", [1.0, 2.0])
    first = batch(server, body, query)
    again = batch(server, body, query)  # a retry: its first answer was lost on the way
    assert first[0] == again[0] == 200
    assert unpackb(first[1]) == unpackb(again[1]) == {"done": 2, "errors": []}
    assert raw(server, "/end_episode", {"episode_id": "e", "observation": o(9)})[0] == 200
    wait_finished(server.env, ["e"])
    observed = [float(s[0][AGENT][0]) for s in loop.steps["e"]]
    if query:
        assert observed == [1.0, 2.0, 9.0]  # each step once
    else:
        assert observed == [1.0, 2.0, 1.0, 2.0, 9.0]  # without an id it ran twice


def test_an_id_reused_with_another_body_or_malformed_is_refused(served):
    server, loop, _ = served
    assert raw(server, "/start_episode", {"episode_id": "f"})[0] == 200
    assert batch(server, steps_body("f", [1.0]), "?id=x")[0] == 200
    status, data = batch(server, steps_body("f", [2.0]), "?id=x")
    assert status == 409 and json.loads(data)["error"] == "SequenceError"
    # Ids are per client: another client's batch under the same id runs.
    assert raw(server, "/start_episode", {"episode_id": "g"}, "you")[0] == 200
    assert batch(server, steps_body("g", [3.0]), "?id=x", "you")[0] == 200
    for bad in ("?id=", "?id=a%20b", "?id=" + "a" * 65, "?id=a&id=b"):
        status, data = batch(server, steps_body("f", [4.0]), bad)
        assert status == 400 and "id" in json.loads(data)["message"], bad
    assert server.env.stats.get("dropped_actions", 0) == 0


def test_batch_ids_book():
    ids = BatchIds(max_ids=2)
    assert ids.begin(("o", "a"), b"1") is None
    with pytest.raises(RequestInProgress):
        ids.begin(("o", "a"), b"1")
    with pytest.raises(SequenceError):
        ids.begin(("o", "a"), b"2")
    ids.failed(("o", "a"))
    assert ids.begin(("o", "a"), b"2") is None  # a failed batch left its id free
    from jaxsampler.serving.sequence import Answer

    ids.succeeded(("o", "a"), Answer(200, b"A", "t"))
    assert ids.begin(("o", "a"), b"2") == Answer(200, b"A", "t")
    for k in ("b", "c"):
        assert ids.begin(("o", k), b"x") is None
        ids.succeeded(("o", k), Answer(200, k.encode(), "t"))
    assert len(ids) == 2 and ids.begin(("o", "a"), b"2") is None  # the oldest was forgotten


def test_a_flush_whose_answer_is_lost_runs_its_rewards_once(served):
    """PolicyClient.flush sends deferred rewards as one /batch; its answer is lost once:
    the retry (same id, same bytes) is answered from the record, the rewards count once."""
    server, loop, _ = served
    proxy = LosingProxy(server.address)
    c = PolicyClient(proxy.address, backoff_s=0.01)
    eid = c.start_episode()
    c.get_action(eid, o(1))
    c.log_returns(eid, 1.5)
    c.log_returns(eid, 2.0)
    proxy.lose, proxy.lose_path = 1, b"POST /batch"
    c.flush()
    (lost,) = proxy.lost
    assert unpackb(body_of(lost)) == {"done": 2, "errors": []}
    assert proxy.count(b"POST /batch?id=") == 2  # the lost one and its retry
    c.end_episode(eid, o(2))
    wait_finished(server.env, [eid])
    assert rewards_of(loop, eid) == [0.0, 3.5]
    c.close()
    proxy.close()
