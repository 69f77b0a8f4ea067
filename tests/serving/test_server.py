"""PolicyServer / PolicyClient over loopback HTTP.

Remote mode is checked with the same exactly-once bookkeeping as the in-process
ExternalEnv test (the server is a HostEnv; the test's poll loop answers); local mode
with a tiny jitted MLP policy whose params are pulled from the server.
"""

from __future__ import annotations

import json
import socket
import threading

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.constants import ALL_AGENTS
from jaxsampler.envs.base import DEFAULT_AGENT_ID as AGENT
from jaxsampler.episodes.codec import packb, unpackb
from jaxsampler.host_envs.base import HostEnv
from jaxsampler.host_envs.external import (
    CLIENT_POLICY_INFO,
    EpisodeStateError,
    ExternalEnv,
    ExternalMultiAgentEnv,
    InvalidDataError,
    UnknownEpisodeError,
)
from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.server import PROTOCOL_VERSION, PolicyServer, PolicyServerError
from tests.fakes import (
    ACT,
    OBS,
    PollLoop,
    answer,
    check_exactly_once,
    http_request,
    run_clients,
    simulate,
    wait_finished,
)


def raw(server, method, path, body=None, headers=None):
    status, head, data = http_request(server, method, path, body, headers)
    return status, head.get("Content-Type"), data


def error_of(status, ctype, data):
    assert ctype == "application/json", (status, data)
    err = json.loads(data)
    assert err["message"]
    return status, err


def test_remote_many_clients_exactly_once_and_disconnect(served):
    server, loop, holds = served
    assert isinstance(server, HostEnv) and server.agent_ids == (AGENT,)
    env = server.env
    holds.add("gone")
    c = PolicyClient(server.address)
    c.start_episode("gone")
    c.log_returns("gone", 1.0)
    c.flush()  # the deferred reward goes now, not with this client's next request
    host, port = server.address[len("http://") :].split(":")

    def clients(cid):
        if cid == 0:  # the disconnecting client: sends get_action, then hangs up
            sock = socket.create_connection((host, int(port)))
            body = packb({"episode_id": "gone", "observation": np.full(3, 9.0, np.float32)})
            sock.sendall(  # as client c, whose episode it is
                b"POST /get_action HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
                + f"X-Client-Id: {c.client_id}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            while "gone" not in loop.held:  # delivered to the sampler, answer held back
                threading.Event().wait(0.002)
            sock.close()
            return {}
        with PolicyClient(server.address) as client:
            return simulate(client, cid, n_episodes=3, n_steps=5)

    logs = run_clients(12, clients)
    wait_finished(env, [e for log in logs.values() for e in log] + ["gone"])
    n = check_exactly_once(loop, logs, others=["gone"])
    assert n == 11 * 3 * 6
    first, last = loop.steps["gone"]
    assert first[1] == {AGENT: 1.0}  # the logged reward preceding the first observation
    np.testing.assert_array_equal(last[0][AGENT], np.full(3, 9.0))
    assert last[3] == {AGENT: True, ALL_AGENTS: True} and last[4][AGENT] == {"abandoned": True}
    assert env.episode_status("gone") == "abandoned"
    with pytest.raises(EpisodeStateError, match="abandoned"):
        c.get_action("gone", np.zeros(3))
    assert max(loop.poll_sizes) > 1
    c.close()


def test_bad_requests_get_4xx_and_server_keeps_serving(served):
    server, loop, _ = served
    mp = {"Content-Type": "application/msgpack"}
    s, e = error_of(*raw(server, "POST", "/get_action", b"\xc1\xc1 not msgpack", mp))
    assert s == 400
    s, e = error_of(*raw(server, "POST", "/get_action", packb([1, 2]), mp))
    assert s == 400 and "map" in e["message"]
    s, e = error_of(*raw(server, "POST", "/get_action", packb({"episode_id": "x"}), mp))
    assert s == 400 and "observation" in e["message"]
    s, e = error_of(
        *raw(
            server,
            "POST",
            "/get_action",
            packb({"episode_id": "nope", "observation": [0, 0, 0]}),
            mp,
        )
    )
    assert s == 404 and e["error"] == "UnknownEpisodeError" and "nope" in e["message"]
    s, e = error_of(*raw(server, "POST", "/log_returns", json.dumps({"a": 1}).encode(), mp))
    assert s == 400
    s, e = error_of(*raw(server, "POST", "/get_action", b"x" * 5000, mp))
    assert s == 413 and "max_body_bytes" in e["message"]
    s, e = error_of(*raw(server, "POST", "/nowhere", packb({}), mp))
    assert s == 404
    s, e = error_of(*raw(server, "GET", "/get_action"))
    assert s == 405
    s, e = error_of(*raw(server, "GET", "/weights"))
    assert s == 404 and "set_weights" in e["message"]

    client = PolicyClient(server.address)
    eid = client.start_episode()
    with pytest.raises(EpisodeStateError, match="already been started"):
        client.start_episode(eid)
    with pytest.raises(InvalidDataError, match="shape"):
        client.get_action(eid, np.zeros(5, np.float32))
    with pytest.raises(InvalidDataError, match="finite"):  # checked before the call returns
        client.log_returns(eid, float("nan"))
    client.log_returns("nope", 1.0)  # deferred: the next request carries it, and fails with it
    with pytest.raises(UnknownEpisodeError, match="deferred log_returns"):
        client.get_action(eid, np.zeros(3, np.float32))
    client.log_returns("nope", 1.0)
    with pytest.raises(UnknownEpisodeError):
        client.flush()
    eager = PolicyClient(server.address, defer_returns=False)
    with pytest.raises(UnknownEpisodeError):
        eager.log_returns("nope", 1.0)
    eager.close()
    batch = {
        "commands": [
            {"command": "log_returns", "episode_id": "nope", "reward": 1.0},
            {"command": "get_action", "episode_id": eid, "observation": [0, 0, 0]},
            {"command": "log_returns", "episode_id": eid, "reward": 1.0},
        ]
    }
    # As the client (the episode's owner; another client would get 404 for it too).
    s, ctype, data = raw(
        server, "POST", "/batch", packb(batch), {**mp, "X-Client-Id": client.client_id}
    )
    assert s == 200 and ctype == "application/msgpack"
    res = unpackb(data)
    assert res["done"] == 1 and [(x["index"], x["status"]) for x in res["errors"]] == [
        (0, 404),
        (1, 400),
    ]
    s, e = error_of(*raw(server, "POST", "/batch", packb({"commands": 3}), mp))
    assert s == 400 and "commands" in e["message"]
    # Still serving; the episode survived every error above (and got the batched reward).
    obs = np.array([1, 2, 3], np.float32)
    assert client.get_action(eid, obs) == answer(obs)
    client.end_episode(eid, obs)
    wait_finished(server.env, [eid])
    (s0, s1) = loop.steps[eid]
    assert s0[1] == {AGENT: 1.0} and s1[2][ALL_AGENTS]
    info = client.server_info()
    assert (
        info["protocol"] == PROTOCOL_VERSION == 2
        and info["observation_space"] == OBS
        and info["multi_agent"] is False
    )
    client.close()


def test_multi_agent_remote():
    env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=("a", "b"))
    with PolicyServer(env) as server:
        loop = PollLoop(server)
        try:
            client = PolicyClient(server.address)
            eid = client.start_episode()
            o = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)}
            assert client.get_action(eid, o) == {"a": answer(o["a"]), "b": answer(o["b"])}
            client.log_returns(eid, {"a": 1.0}, {"b": {"x": 1}}, {"b": True})
            client.log_action(eid, {"a": o["b"], "b": o["a"]}, {"a": 3})
            with pytest.raises(InvalidDataError):
                client.log_action(eid, {"a": o["a"]}, {"a": 3, "b": 1})
            client.end_episode(eid, {"a": o["a"]})
            wait_finished(env, [eid])
        finally:
            loop.close()
    s0, s1, s2 = loop.steps[eid]
    assert s1[1] == {"a": 1.0, "b": 0.0} and s1[2] == {"a": False, "b": True, ALL_AGENTS: False}
    assert s1[4] == {"a": {}, "b": {"x": 1}} and s1[5] == {"a": 3}
    assert s2[2] == {"a": True, ALL_AGENTS: True}


def test_local_inference_pulls_weights_and_logs_experience():
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(8,), explore=False)
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    with PolicyServer(env) as server:
        loop = PollLoop(server)
        try:
            params1 = policy.init(jax.random.PRNGKey(1))
            assert server.set_weights(params1) == 1
            client = PolicyClient(server.address, "local", policy=policy, update_interval=0.0)
            eids, expected = [], []
            for e, params in enumerate([params1, policy.init(jax.random.PRNGKey(2))]):
                if e == 1:
                    assert server.set_weights(params) == 2
                eid = client.start_episode()
                eids.append(eid)
                for t in range(4):
                    obs = np.array([e, t, 100.0 * t], np.float32)
                    act = client.get_action(eid, obs)
                    ref, extras, _ = policy(
                        params, obs[None, None], jax.random.PRNGKey(0), js.policies.NoState()
                    )
                    assert int(act) == int(ref[0, 0])
                    expected.append((eid, obs, int(act), float(extras["vf_preds"][0, 0]), e + 1))
                    client.log_returns(eid, 1.0)
                client.end_episode(eid, np.zeros(3, np.float32))
            assert client.update_policy_weights() is False  # 304: already current
            client.flush()
            wait_finished(env, eids)
            client.close()
        finally:
            loop.close()
    got = [(eid, s) for eid in eids for s in loop.steps[eid][:-1]]
    assert len(got) == len(expected) == 8
    for (eid, s), (e_eid, obs, act, vf, version) in zip(got, expected, strict=True):
        assert eid == e_eid
        np.testing.assert_array_equal(s[0][AGENT], obs)
        assert s[5] == {AGENT: act}  # recorded as the client's action
        cp = s[4][AGENT][CLIENT_POLICY_INFO]
        assert cp["weights_version"] == version
        assert set(cp["extra_model_outputs"]) == {"action_dist_inputs", "action_logp", "vf_preds"}
        assert float(cp["extra_model_outputs"]["vf_preds"]) == pytest.approx(vf, rel=1e-5, abs=1e-6)
    for eid in eids:
        assert loop.steps[eid][-1][1] == {AGENT: 1.0} and loop.steps[eid][-1][2][ALL_AGENTS]


def test_local_client_errors():
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(4,))
    with PolicyServer(ExternalEnv(OBS, ACT)) as server:
        client = PolicyClient(server.address, "local", policy=policy)
        eid = client.start_episode()
        with pytest.raises(PolicyServerError, match="set_weights"):
            client.get_action(eid, np.zeros(3, np.float32))
        with pytest.raises(UnknownEpisodeError):
            client.get_action("nope", np.zeros(3, np.float32))
        with pytest.raises(InvalidDataError):
            client.get_action(eid, np.zeros(2, np.float32))
        server.env.start_episode("dup")
        client.start_episode("dup")  # queued; the server refuses it in the background
        with pytest.raises(EpisodeStateError, match="server: .*already been started"):
            client.flush()
        client.close()
    with pytest.raises(ValueError, match="policy"):
        PolicyClient("http://127.0.0.1:1", "local")
    with pytest.raises(ValueError, match="address"):
        PolicyClient("127.0.0.1:80")


def test_codec_rejects_object_dtypes():
    with pytest.raises(ValueError):
        unpackb(packb({"x": np.zeros(2)}).replace(b"<f8", b"|O8"), objects=False)
