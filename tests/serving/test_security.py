"""PolicyServer access control: bearer token, TLS, and episode ownership by client id.

The reproducers: without authentication any local user could inject experience, read
``/weights`` or end other clients' episodes whose ids they knew. TLS runs with a
self-signed certificate made here with the ``openssl`` command.

The ownership and quota tests at the end check the env's ``owner=`` contract end to end
(an episode belongs to the client that started it); they need the external env that
knows owners (``ExternalEnvBase.start_episode(..., owner=...)``).
"""

from __future__ import annotations

import inspect
import re
import shutil
import ssl
import subprocess
import time

import pytest

from jaxsampler.envs.base import DEFAULT_AGENT_ID as AGENT
from jaxsampler.episodes.codec import unpackb
from jaxsampler.host_envs.external import (
    CapacityError,
    ExternalEnv,
    UnknownEpisodeError,
)
from jaxsampler.serving import server as server_module
from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.server import PROTOCOL_VERSION, PolicyServer, PolicyServerError
from tests.fakes import ACT, OBS, PollLoop, answer
from tests.serving.test_http_edges import OB, Responses, connect, get, json_error, post, until

TOKEN = "t0ps3cret-token"
OWNED = "owner" in inspect.signature(ExternalEnv.start_episode).parameters


def auth(token: str = TOKEN) -> bytes:
    return f"Authorization: Bearer {token}\r\n".encode()


# -- token -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        b"",
        auth("wrong"),
        auth(TOKEN[:-1]),
        b"Authorization: " + TOKEN.encode() + b"\r\n",  # no scheme
        auth() + auth(),  # two of them
    ],
)
def test_requests_without_the_token_get_401_and_the_connection_closes(extra):
    with PolicyServer(ExternalEnv(OBS, ACT), token=TOKEN) as server, connect(server) as sock:
        sock.sendall(get("/weights", extra=extra))
        rs = Responses(sock)
        (r,) = rs.read(1)
        assert json_error(r, 401)["error"] == "Unauthorized"
        assert r["headers"]["www-authenticate"].startswith("Bearer")
        assert rs.closed()


def test_unauthenticated_body_is_not_read_and_nothing_runs():
    env = ExternalEnv(OBS, ACT)
    with PolicyServer(env, token=TOKEN) as server, connect(server) as sock:
        data = post("/start_episode", {"episode_id": "intruder"})
        head = data[: data.index(b"\r\n\r\n") + 4]
        sock.sendall(head)  # the body never comes: the 401 does not wait for it
        (r,) = Responses(sock).read(1)
        assert r["status"] == 401
    assert env.episode_status("intruder") == "unknown"


def test_right_token_is_served_and_compared_in_constant_time(monkeypatch):
    compared = []
    real = server_module.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(server_module.hmac, "compare_digest", spy)
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    with PolicyServer(env, token=TOKEN) as server:
        loop = PollLoop(server)
        try:
            with connect(server) as sock:
                sock.sendall(get("/info", extra=auth()))
                (r,) = Responses(sock).read(1)
                assert r["status"] == 200 and unpackb(r["body"])["protocol"] == PROTOCOL_VERSION
            with PolicyClient(server.address, token=TOKEN) as c:
                eid = c.start_episode()
                assert c.get_action(eid, OB[1]) == answer(OB[1])
            with PolicyClient(server.address) as c, pytest.raises(PolicyServerError) as e:
                c.server_info()
            assert e.value.status == 401
            with PolicyClient(server.address, token="nope") as c, pytest.raises(PolicyServerError):
                c.start_episode()
        finally:
            loop.close()
    assert compared and all(b == f"Bearer {TOKEN}".encode() for _, b in compared)


def test_token_and_client_id_arguments_are_checked():
    with pytest.raises(ValueError, match="token"):
        PolicyClient("http://127.0.0.1:1", token="")
    with pytest.raises(ValueError, match="client_id"):
        PolicyClient("http://127.0.0.1:1", client_id="bad id\r\nX-Evil: 1")
    with pytest.raises(ValueError, match="token"):
        PolicyServer(ExternalEnv(OBS, ACT), token="")
    with pytest.raises(ValueError, match="https"):
        PolicyClient("http://127.0.0.1:1", ssl_context=ssl.create_default_context())


# -- TLS ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 / localhost: ``(certfile, keyfile)``."""
    if shutil.which("openssl") is None:
        pytest.skip("TLS tests need the openssl command (the cryptography package is absent)")
    d = tmp_path_factory.mktemp("tls")
    crt, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],  # fmt: skip
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(crt), str(key)


def contexts(cert):
    crt, key = cert
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(crt, key)
    return server_ctx, ssl.create_default_context(cafile=crt)


def test_tls_serves_https_clients_with_the_token(cert):
    server_ctx, client_ctx = contexts(cert)
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, action_timeout_s=1.0)  # ticks every 0.1 s
    with PolicyServer(env, token=TOKEN, ssl_context=server_ctx, keepalive_timeout_s=0.2) as server:
        assert server.address.startswith("https://127.0.0.1:")
        loop = PollLoop(server)
        try:
            with PolicyClient(server.address, token=TOKEN, ssl_context=client_ctx) as c:
                eid = c.start_episode()
                for t in range(3):
                    assert c.get_action(eid, OB[t]) == answer(OB[t])
                c.log_returns(eid, 1.0)
                first = c._tls.conn.sock
                until(lambda: not server._live)  # the idle connection is reaped ...
                c.end_episode(eid, OB[3])  # ... and the client reconnects transparently
                assert c._tls.conn.sock is not first
            until_done = time.monotonic() + 60  # a hang guard only
            while env.episode_status(eid) != "completed" and time.monotonic() < until_done:
                time.sleep(0.01)
            assert env.episode_status(eid) == "completed"
            assert [s[1][AGENT] for s in loop.steps[eid]] == [0.0, 0.0, 0.0, 1.0]
        finally:
            loop.close()


def test_tls_refuses_plaintext_and_untrusted_clients_and_keeps_serving(cert):
    server_ctx, client_ctx = contexts(cert)
    with PolicyServer(ExternalEnv(OBS, ACT), ssl_context=server_ctx) as server:
        plain = "http://" + server.address[len("https://") :]
        with PolicyClient(plain, timeout=5.0) as c, pytest.raises(ConnectionError):
            c.server_info()  # no HTTP answer comes back from a TLS port
        c = PolicyClient(server.address, timeout=5.0)  # system CAs: not trusted
        with c, pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            c.server_info()
        with PolicyClient(server.address, ssl_context=client_ctx) as c:
            assert c.server_info()["protocol"] == PROTOCOL_VERSION
        until(lambda: not server._handshaking)  # the failed handshakes left nothing behind


# -- client ids and episode ids ------------------------------------------------------------------


class RecordingEnv(ExternalEnv):
    """An ExternalEnv recording the ``owner`` the server passes to each call."""

    calls: list

    def _kw(self, name, owner):
        self.calls.append((name, owner))
        return {"owner": owner} if OWNED else {}

    def start_episode(self, episode_id=None, training_enabled=True, *, owner=None):
        return super().start_episode(episode_id, training_enabled, **self._kw("start", owner))

    def submit(self, episode_id, obs, action, extra_infos, want_action, *, owner=None, **kw):
        kw.update(self._kw("submit", owner))
        return super().submit(episode_id, obs, action, extra_infos, want_action, **kw)

    def log_agent_returns(self, episode_id, rewards, infos, dones, owner=None):
        kw = self._kw("returns", owner)
        return super().log_agent_returns(episode_id, rewards, infos, dones, **kw)

    def end_agent_episode(self, episode_id, obs, truncated, owner=None):
        return super().end_agent_episode(episode_id, obs, truncated, **self._kw("end", owner))


def test_server_runs_every_call_as_the_clients_id():
    env = RecordingEnv(OBS, ACT, max_wait_s=0.0)
    env.calls = []
    with PolicyServer(env) as server:
        loop = PollLoop(server)
        try:
            with PolicyClient(server.address) as c:
                me = c.client_id
                eid = c.start_episode()
                c.get_action(eid, OB[0])
                c.log_action(eid, OB[1], 3)
                c.log_returns(eid, 1.0)
                c.end_episode(eid, OB[2])
            with connect(server) as sock:  # no X-Client-Id: the anonymous owner
                sock.sendall(post("/start_episode", {"episode_id": "anon"}))
                assert Responses(sock).read(1)[0]["status"] == 200
        finally:
            loop.close()
    assert env.calls == [
        ("start", me),
        ("submit", me),
        ("submit", me),
        ("returns", me),  # deferred: runs before the end_episode it travelled with
        ("end", me),
        ("start", server_module.ANONYMOUS_OWNER),
    ]


def test_client_ids_are_random_and_malformed_ones_get_400():
    a, b = PolicyClient("http://127.0.0.1:1"), PolicyClient("http://127.0.0.1:1")
    assert re.fullmatch("[0-9a-f]{32}", a.client_id) and a.client_id != b.client_id
    with PolicyServer(ExternalEnv(OBS, ACT)) as server:
        for bad in (b"X-Client-Id: a b\r\n", b"X-Client-Id: " + b"x" * 65 + b"\r\n"):
            with connect(server) as sock:
                sock.sendall(get("/info", extra=bad))
                (r,) = Responses(sock).read(1)
                assert "X-Client-Id" in json_error(r, 400)["message"]


def test_server_made_episode_ids_are_random_uuids():
    with PolicyServer(ExternalEnv(OBS, ACT)) as server, PolicyClient(server.address) as c:
        ids = [c.start_episode() for _ in range(20)]
    assert len(set(ids)) == 20 and all(re.fullmatch("[0-9a-f]{32}", e) for e in ids)


# -- ownership end to end (needs the owner-aware external env) -----------------------------------


def test_a_client_cannot_touch_another_clients_episode():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    with PolicyServer(env) as server:
        loop = PollLoop(server)
        try:
            owner = PolicyClient(server.address)
            other = PolicyClient(server.address, defer_returns=False)
            eid = owner.start_episode()
            assert owner.get_action(eid, OB[0]) == answer(OB[0])
            calls = {
                "get_action": lambda: other.get_action(eid, OB[1]),
                "log_action": lambda: other.log_action(eid, OB[1], 1),
                "log_returns": lambda: other.log_returns(eid, 100.0),
                "end_episode": lambda: other.end_episode(eid, OB[1]),
            }
            for name, call in calls.items():
                with pytest.raises(UnknownEpisodeError) as e:
                    call()
                with pytest.raises(UnknownEpisodeError) as unknown:  # the same as a bad id
                    other.end_episode("f" * 32, OB[1])
                assert str(e.value).replace(eid, "ID") == str(unknown.value).replace("f" * 32, "ID")
                assert env.episode_status(eid) == "running", name
            with connect(server) as sock:  # nor can a raw request without a client id
                sock.sendall(post("/end_episode", {"episode_id": eid, "observation": OB[1]}))
                json_error(Responses(sock).read(1)[0], 404)
            assert owner.get_action(eid, OB[1]) == answer(OB[1])  # untouched
            owner.log_returns(eid, 2.0)
            owner.end_episode(eid, OB[2])
            owner.close()
            other.close()
            deadline = time.monotonic() + 60  # a hang guard only
            while env.episode_status(eid) != "completed" and time.monotonic() < deadline:
                time.sleep(0.01)
            assert env.episode_status(eid) == "completed"
        finally:
            loop.close()
    assert [s[1][AGENT] for s in loop.steps[eid]] == [0.0, 0.0, 2.0]


def test_per_client_episode_quota_gives_503():
    env = ExternalEnv(OBS, ACT, max_episodes_per_owner=2)  # the env's per-owner quota
    with PolicyServer(env) as server:
        a, b = PolicyClient(server.address), PolicyClient(server.address)
        a.start_episode()
        a.start_episode()
        with pytest.raises(CapacityError):
            a.start_episode()
        assert b.start_episode()  # others are not affected
        a.close()
        b.close()
