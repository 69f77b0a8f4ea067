"""Structure-aware fuzzing of the policy server's HTTP bodies (hypothesis).

One live :class:`PolicyServer` per kind (single-agent, multi-agent) for the module, tiny
spaces, answered by a poll loop. Each example starts a fresh episode, sends one hostile
request (a command map from the protocol table in :mod:`jaxsampler.serving.protocol`
whose fields are drawn from wrong types, NaN/inf, huge ints, wrong shapes and dtypes,
malformed array payloads, unknown agents, nested containers, missing fields, big
strings within the body limit; or a hostile ``/batch``; or random bytes) over a raw
socket, then checks:

* the answer is a status < 500; an error has a JSON body ``{error, message}``; a 200
  has a msgpack map;
* a refused request changed nothing: a valid ``get_action`` on the example's episode
  is still answered with 200 and a valid action;
* a normal client (one PolicyClient, one long episode) still steps after every example,
  and at the end every one of its steps reached the poll loop exactly once.

Values nest at most 40 deep (a far deeper msgpack ext nesting crashes the decoder; see
the module's report) and no space objects (ext type 5) are sent.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections import defaultdict

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxsampler.constants import ALL_AGENTS, DEFAULT_AGENT_ID
from jaxsampler.episodes.codec import packb, unpackb
from jaxsampler.host_envs.external import ExternalEnv, ExternalMultiAgentEnv
from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.server import PolicyServer
from jaxsampler.spaces import Box, Discrete

OBS, ACT = Box(-10.0, 10.0, (3,), np.float32), Discrete(3)
AGENTS = ("x", "y")
MAX_BODY = 64 << 10
MP = "application/msgpack"
COMMANDS = ("start_episode", "get_action", "log_action", "log_returns", "end_episode")


# -- the served side ----------------------------------------------------------------------


class Answerer:
    """Polls the server, records every delivered step per episode, answers action 1 for
    every agent that is not done."""

    def __init__(self, env) -> None:
        self.env = env
        self.steps: dict = defaultdict(list)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            r = self.env.poll(timeout=0.05)
            actions = {}
            for eid, obs in r.obs.items():
                self.steps[eid].append((obs, r.rewards[eid], r.terminateds[eid]))
                if r.terminateds[eid][ALL_AGENTS] or r.truncateds[eid][ALL_AGENTS]:
                    continue
                if eid in r.off_policy_actions:
                    continue
                actions[eid] = {a: 1 for a in obs if not r.terminateds[eid].get(a)}
            if actions:
                self.env.send_actions(actions)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


class Harness:
    """A server, its poll loop, a normal client with one long episode, and raw requests."""

    def __init__(self, multi_agent: bool) -> None:
        self.multi_agent = multi_agent
        if multi_agent:
            env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=AGENTS, max_wait_s=0.001)
        else:
            env = ExternalEnv(OBS, ACT, max_wait_s=0.001)
        self.server = PolicyServer(env, port=0, max_body_bytes=MAX_BODY)
        self.loop = Answerer(self.server)
        host, port = self.server.address[len("http://") :].rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.normal = PolicyClient(self.server.address)
        self.normal_eid = self.normal.start_episode(None)
        self.normal_sent: list[np.ndarray] = []

    def obs(self, k: float) -> object:
        o = np.array([k % 10, 0.5, -0.5], np.float32)
        return {a: o for a in AGENTS} if self.multi_agent else o

    def normal_step(self) -> None:
        """The normal client steps on: its action must come back, valid."""
        o = self.obs(len(self.normal_sent))
        act = self.normal.get_action(self.normal_eid, o)
        if self.multi_agent:
            assert set(act) == set(AGENTS) and all(int(v) == 1 for v in act.values())
        else:
            assert int(act) == 1
        self.normal.log_returns(
            self.normal_eid, {a: 1.0 for a in AGENTS} if self.multi_agent else 1.0
        )
        self.normal_sent.append(o)

    def raw(self, method: str, path: str, body: bytes | None = None) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            headers = {"X-Client-Id": "fuzzer"}
            if body is not None:
                headers["Content-Type"] = MP
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type") or "", resp.read()
        finally:
            conn.close()

    def post(self, command: str, msg: object) -> tuple[int, object]:
        """POSTs ``msg`` (encoded unless already bytes); checks the answer's form; returns
        (status, decoded body)."""
        body = msg if isinstance(msg, bytes) else packb(msg)
        status, ctype, data = self.raw("POST", "/" + command, body)
        return status, check_answer(status, ctype, data)

    def start(self) -> str:
        status, out = self.post("start_episode", {"episode_id": None, "training_enabled": True})
        assert status == 200, out
        return out["episode_id"]

    def close(self) -> None:
        """Ends the normal episode and checks all of its steps arrived exactly once."""
        final = self.obs(99)
        self.normal.end_episode(self.normal_eid, final)
        self.normal.close()
        ev = threading.Event()
        for _ in range(500):
            if self.server.env.episode_status(self.normal_eid) == "completed":
                break
            ev.wait(0.01)
        self.loop.close()
        self.server.close()
        got = self.loop.steps[self.normal_eid]
        assert len(got) == len(self.normal_sent) + 1
        for (obs, _, _), sent in zip(got, [*self.normal_sent, final], strict=True):
            want = sent if self.multi_agent else {DEFAULT_AGENT_ID: sent}
            assert set(obs) == set(want)
            for a in want:
                np.testing.assert_array_equal(obs[a], want[a])
        rewards = [sum(r.values()) for _, r, _ in got[1:]]
        assert rewards == [len(AGENTS) if self.multi_agent else 1.0] * len(self.normal_sent)
        assert got[-1][2][ALL_AGENTS] and not any(t[ALL_AGENTS] for _, _, t in got[:-1])


def check_answer(status: int, ctype: str, data: bytes) -> object:
    assert status < 500, (status, data[:300])
    if status == 200:
        assert ctype == MP, ctype
        out = unpackb(data, objects=False, spaces=True)  # /info answers carry spaces
        assert isinstance(out, dict)
        return out
    assert ctype == "application/json", (status, ctype, data[:200])
    err = json.loads(data)
    assert isinstance(err["error"], str) and err["error"], err
    assert isinstance(err["message"], str) and err["message"], err
    return err


@pytest.fixture(scope="module")
def single():
    h = Harness(multi_agent=False)
    yield h
    h.close()


@pytest.fixture(scope="module")
def multi():
    h = Harness(multi_agent=True)
    yield h
    h.close()


# -- strategies -------------------------------------------------------------------------------


def ext(code: int, payload: object) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(payload, use_bin_type=True))


# Array payloads that lie: wrong byte counts, bad dtype strings, negative or huge shapes,
# object dtypes, not-a-list shapes (ext type 1: [dtype.str, shape, raw bytes]).
bad_arrays = st.one_of(
    st.builds(
        lambda d, shape, n: ext(1, [d, shape, b"\x00" * n]),
        st.sampled_from(["<f4", "<f8", "|b1", "<i8", "<f99", "|O8", "|V4", "", "<U3", ">f4"]),
        st.one_of(
            st.lists(st.integers(-3, 5), max_size=3),
            st.just([1 << 40]),
            st.just([-1]),
            st.just("3"),
            st.none(),
        ),
        st.integers(0, 40),
    ),
    st.builds(lambda p: ext(2, p), st.lists(st.integers(0, 3), max_size=3)),
    st.builds(lambda n: ext(4, [[n], list(range(max(n, 0)))]), st.integers(-1, 4)),
    st.builds(lambda n: ext(4, [[2], ["a", None, 1][:n]]), st.integers(0, 3)),
    st.builds(
        lambda code, b: msgpack.ExtType(code, b),
        st.integers(0, 127).filter(lambda c: c != 5),
        st.binary(max_size=16),
    ),
)

np_arrays = hnp.arrays(
    dtype=st.sampled_from(
        [np.float32, np.float64, np.float16, np.int8, np.int64, np.uint8, np.uint64, np.bool_]
    ),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    elements=None,
)

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
    np_arrays,
    bad_arrays,
    st.builds(lambda n: "s" * n, st.integers(1000, 20_000)),  # big, within max_body_bytes
)

values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=6), st.integers(-3, 3)), inner, max_size=4),
        st.tuples(inner, inner),
    ),
    max_leaves=12,
)


def nest(depth: int, kind: str, leaf: object) -> object:
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else ({"k": leaf} if kind == "dict" else (leaf,))
    return leaf


deep = st.builds(nest, st.integers(1, 40), st.sampled_from(["list", "dict", "tuple"]), leaves)

good_obs = hnp.arrays(np.float32, (3,), elements=st.floats(-10, 10, width=32))
wrong_obs = st.one_of(
    hnp.arrays(np.float32, (3,), elements=st.sampled_from([np.nan, np.inf, -np.inf, 1e30])),
    hnp.arrays(np.float32, st.sampled_from([(2,), (4,), (1, 3), (3, 1), (), (0,)])),
    hnp.arrays(st.sampled_from([np.int64, np.bool_, np.uint8, np.float16, np.complex64]), (3,)),
    st.lists(st.floats(allow_nan=True), min_size=0, max_size=5),
    values,
    deep,
)
any_obs = st.one_of(good_obs, wrong_obs)


def agent_dict(inner: st.SearchStrategy) -> st.SearchStrategy:
    """Multi-agent dicts: known and unknown agents (non-str keys too), empty dicts."""
    keys = st.one_of(
        st.sampled_from(AGENTS), st.sampled_from(["z", "", ALL_AGENTS]), st.integers(0, 2)
    )
    return st.one_of(st.dictionaries(keys, inner, max_size=3), inner)


episode_ids = st.one_of(
    st.just("LIVE"),  # replaced by the example's own episode
    st.text(max_size=10),
    st.integers(-(2**63), 2**64 - 1),
    st.none(),
    st.builds(lambda n: "e" * n, st.integers(1000, 20_000)),
    values,
)


def hostile_fields(multi_agent: bool) -> dict[str, st.SearchStrategy]:
    """Per documented field (plus an unknown one), what a hostile value of it may be."""
    obs = agent_dict(any_obs) if multi_agent else any_obs
    act = st.one_of(st.integers(-5, 5), st.integers(-(2**63), 2**64 - 1), values)
    reward = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**63), 2**64 - 1), values
    )
    return {
        "episode_id": episode_ids,
        "training_enabled": st.one_of(st.booleans(), values),
        "observation": obs,
        "action": agent_dict(act) if multi_agent else act,
        "reward": agent_dict(reward) if multi_agent else reward,
        "info": st.one_of(
            st.none(), agent_dict(st.dictionaries(st.text(max_size=4), values, max_size=2)), values
        ),
        "done": st.one_of(st.none(), agent_dict(st.one_of(st.booleans(), values)), values),
        "truncated": st.one_of(st.booleans(), values),
        "returns": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "episode_id": episode_ids,
                        "reward": agent_dict(reward) if multi_agent else reward,
                    },
                    optional={"done": values},
                ),
                max_size=3,
            ),
            values,
        ),
        "zzz_unknown": values,
    }


def valid_command(command: str, multi_agent: bool) -> st.SearchStrategy:
    """A valid message of ``command`` for the example's own (live) episode."""
    obs1 = good_obs
    if multi_agent:
        obs = st.fixed_dictionaries({}, optional={a: obs1 for a in AGENTS}).filter(bool)
    else:
        obs = obs1
    if command == "start_episode":
        return st.fixed_dictionaries({"episode_id": st.none(), "training_enabled": st.booleans()})
    if command == "get_action":
        return st.fixed_dictionaries({"episode_id": st.just("LIVE"), "observation": obs})
    if command == "end_episode":
        return st.fixed_dictionaries(
            {"episode_id": st.just("LIVE"), "observation": obs, "truncated": st.booleans()}
        )
    if command == "log_returns":
        r = st.floats(-1e6, 1e6)
        reward = st.dictionaries(st.sampled_from(AGENTS), r, min_size=1) if multi_agent else r
        return st.fixed_dictionaries({"episode_id": st.just("LIVE"), "reward": reward})
    # log_action: one action per observing agent
    if multi_agent:
        return obs.flatmap(
            lambda o: st.fixed_dictionaries(
                {
                    "episode_id": st.just("LIVE"),
                    "observation": st.just(o),
                    "action": st.fixed_dictionaries({a: st.integers(0, 2) for a in o}),
                }
            )
        )
    return st.fixed_dictionaries(
        {"episode_id": st.just("LIVE"), "observation": obs, "action": st.integers(0, 2)}
    )


def command_map(multi_agent: bool) -> st.SearchStrategy:
    """A hostile command, structure-aware: a valid message of a real command with one to
    three fields replaced by hostile values, deleted, or added."""
    hostile = hostile_fields(multi_agent)

    @st.composite
    def build(draw):
        command = draw(st.sampled_from(COMMANDS))
        msg = dict(draw(valid_command(command, multi_agent)))
        names = draw(
            st.lists(st.sampled_from(sorted(hostile)), min_size=1, max_size=3, unique=True)
        )
        for name in names:
            if name in msg and draw(st.integers(0, 4)) == 0:
                del msg[name]
            else:
                msg[name] = draw(hostile[name])
        return command, msg

    return build()


def batch_body(multi_agent: bool) -> st.SearchStrategy:
    cmd = command_map(multi_agent).map(lambda c: {"command": c[0], **c[1]})
    return st.one_of(
        st.fixed_dictionaries({"commands": st.lists(st.one_of(cmd, values), max_size=4)}),
        st.fixed_dictionaries({}, optional={"commands": values}),
    )


def _safe_pack(v: object) -> bytes:
    """A body that is not a map: ``[v]`` packed (a plain ``nil`` when ``v`` cannot be)."""
    try:
        return packb([v])
    except (TypeError, ValueError, OverflowError):
        return b"\xc0"


def requests(ma: bool) -> st.SearchStrategy:
    """Whole requests: ``(kind, command, payload)``."""
    return st.one_of(
        command_map(ma).map(lambda c: ("cmd", c[0], c[1])),
        batch_body(ma).map(lambda b: ("cmd", "batch", b)),
        st.tuples(st.just("raw"), st.sampled_from([*COMMANDS, "batch"]), st.binary(max_size=200)),
        st.tuples(st.just("raw"), st.sampled_from([*COMMANDS, "batch"]), values.map(_safe_pack)),
    )


def substitute(v: object, live: str) -> object:
    return live if isinstance(v, str) and v == "LIVE" else v


def encode(msg: dict) -> bytes | None:
    try:
        return packb(msg)
    except (TypeError, ValueError, OverflowError):
        return None


# -- the tests ---------------------------------------------------------------------------------


def run_example(h: Harness, req: tuple) -> None:
    live = h.start()
    kind, command, payload = req
    if kind == "raw":
        status, out = h.post(command, payload)
    else:
        msg = dict(payload)
        if "episode_id" in msg:
            msg["episode_id"] = substitute(msg["episode_id"], live)
        if isinstance(msg.get("returns"), list):
            msg["returns"] = [
                {**r, "episode_id": substitute(r["episode_id"], live)}
                if isinstance(r, dict) and "episode_id" in r
                else r
                for r in msg["returns"]
            ]
        if command == "batch" and isinstance(msg.get("commands"), list):
            msg["commands"] = [
                {**c, "episode_id": substitute(c.get("episode_id"), live)}
                if isinstance(c, dict) and "episode_id" in c
                else c
                for c in msg["commands"]
            ]
        body = encode(msg)
        if body is None or len(body) > MAX_BODY:
            return
        status, out = h.post(command, body)
    event(f"{command}: {status} {out.get('error', '') if isinstance(out, dict) else ''}")
    # The example's episode still takes a valid step unless the hostile request was
    # accepted (200) or ended it (it may have been an end_episode with good data).
    if status != 200:
        s2, out2 = h.post("get_action", {"episode_id": live, "observation": h.obs(1)})
        assert s2 == 200, (req, status, out, s2, out2)
        act = out2["action"]
        if h.multi_agent:
            assert set(act) <= set(AGENTS)
        else:
            assert int(act) == 1
    h.normal_step()


@settings(
    max_examples=90,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(req=requests(False))
def test_fuzz_single_agent_bodies(single, req):
    run_example(single, req)


@settings(
    max_examples=90,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(req=requests(True))
def test_fuzz_multi_agent_bodies(multi, req):
    run_example(multi, req)


@settings(max_examples=20, deadline=None)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    path=st.one_of(
        st.sampled_from(["/info", "/weights", "/batch", "/get_action", "/", "//", "/info?x=1"]),
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz/_%?=&.", max_size=30).map(lambda p: "/" + p),
    ),
    body=st.one_of(st.none(), st.binary(max_size=64)),
)
def test_fuzz_methods_and_paths(single, method, path, body):
    status, ctype, data = single.raw(method, path, body)
    check_answer(status, ctype, data)
    single.normal_step()
