"""SampleCollector (RLlib's old-stack API) against a plain MultiAgentEpisode loop.

A scripted two-agent env step list (a late joiner, an agent waiting while rewards
accumulate, agents finishing at different steps) runs next to a single-agent env; the
collector is fed agent by agent, the reference with one ``add_env_step`` per env step.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from jaxsampler.sampling import SampleCollector, episodes_to_batch
from tests.sampling.device.test_multi_agent import assert_same_chunk

POLICY = {"x": "px", "y": "py"}


def o(v):
    return np.array([v], np.float32)


# (actions, obs, rewards, terminateds) per env step; obs at reset: {"x": o(0)}
SCRIPT = [
    ({"x": 0}, {"y": o(1)}, {"x": 1.0}, {}),  # y joins, x waits (hanging)
    ({"y": 1}, {"x": o(2)}, {"x": 0.5, "y": 1.0}, {}),  # x's step completes (reward 1.5)
    ({"x": 2}, {"x": o(3), "y": o(3)}, {"x": 1.0, "y": 1.0}, {}),
    ({"x": 0, "y": 1}, {"x": o(4), "y": o(4)}, {"x": 1.0, "y": 2.0}, {"y": True}),  # y done
    ({"x": 1}, {"x": o(5)}, {"x": 1.0}, {"x": True, "__all__": True}),
]


def reference():
    ep = MultiAgentEpisode("ma", agent_to_module_mapping_fn=lambda aid, _: POLICY[aid])
    ep.add_env_reset(observations={"x": o(0)}, infos={"x": {"i": 0}})
    for t, (actions, obs, rewards, terms) in enumerate(SCRIPT, 1):
        ep.add_env_step(
            obs,
            actions,
            rewards,
            {a: {"i": t} for a in obs},
            terminateds=terms,
            truncateds={"__all__": False},
            extra_model_outputs={a: {"logp": np.float32(-a_)} for a, a_ in actions.items()},
        )
    return ep


def feed(collector, ep, steps, single=None):
    """Feeds the script (and ``single``: a one-agent episode in env 1); yields after each
    env step the queued rows of both policies."""
    collector.add_init_obs(
        episode=ep, agent_id="x", env_id=0, policy_id="px", init_obs=o(0), init_infos={"i": 0}
    )
    if single is not None:
        collector.add_init_obs(
            episode=single, agent_id="x", env_id=1, policy_id="px", init_obs=o(100)
        )
    yield {p: collector.get_inference_input_dict(p) for p in ("px", "py")}
    for t, (actions, obs, rewards, terms) in enumerate(steps, 1):
        for aid in dict.fromkeys([*actions, *obs, *rewards, *terms]):
            if aid == "__all__":
                continue
            if aid in obs and aid not in actions and aid not in ep.agent_episodes:
                collector.add_init_obs(
                    episode=ep.id_,
                    agent_id=aid,
                    env_id=0,
                    policy_id=POLICY[aid],
                    init_obs=obs[aid],
                    init_infos={"i": t},
                )
                values = {}
            else:
                values = {"new_obs": obs[aid], "infos": {"i": t}} if aid in obs else {}
            if aid in actions:
                values.update(actions=actions[aid], logp=np.float32(-actions[aid]))
            if aid in rewards:
                values["rewards"] = rewards[aid]
            done = bool(terms.get(aid) or terms.get("__all__"))
            if values:
                collector.add_action_reward_next_obs(
                    ep.id_, aid, 0, POLICY[aid], done, {**values, "terminateds": done}
                )
        collector.episode_step(ep.id_, terminateds=terms, truncateds={"__all__": False})
        if single is not None:
            collector.add_action_reward_next_obs(
                single.id_,
                "x",
                1,
                "px",
                False,
                {"actions": 1, "rewards": 0.25, "new_obs": o(100 + t), "logp": np.float32(-1)},
            )
            collector.episode_step(single)
        yield {p: collector.get_inference_input_dict(p) for p in ("px", "py")}


def test_collector_builds_the_reference_episode_and_inference_inputs():
    c = SampleCollector(agent_ids=("x", "y"), policy_ids=("px", "py"))
    ep, single = MultiAgentEpisode("ma"), MultiAgentEpisode("sa")
    rows = list(feed(c, ep, SCRIPT, single))
    # Inference inputs: agents with a fresh observation that are not done, in feed order.
    want_rows = [
        {"px": [(0, "x", 0, [0.0]), (1, "x", 0, [100.0])], "py": []},
        {"px": [(1, "x", 1, [101.0])], "py": [(0, "y", 0, [1.0])]},
        {"px": [(0, "x", 1, [2.0]), (1, "x", 2, [102.0])], "py": []},
        {"px": [(0, "x", 2, [3.0]), (1, "x", 3, [103.0])], "py": [(0, "y", 1, [3.0])]},
        {"px": [(0, "x", 3, [4.0]), (1, "x", 4, [104.0])], "py": []},  # y is done
        {"px": [(1, "x", 5, [105.0])], "py": []},
    ]
    for got, want in zip(rows, want_rows, strict=True):
        for pid, w in want.items():
            g = got[pid]
            assert [
                (int(e), a, int(t), list(ob))
                for e, a, t, ob in zip(
                    g.get("env_id", []),
                    g.get("agent_id", []),
                    g.get("t", []),
                    g.get("obs", []),
                    strict=True,
                )
            ] == w
            if w:
                assert list(g["eps_id"]) == ["ma" if e == 0 else "sa" for e, *_ in w]
                assert list(g["agent_index"]) == [("x", "y").index(a) for _, a, *_ in w]
    assert c.total_env_steps() == 2 * len(SCRIPT)
    assert c.total_agent_steps() == reference().agent_steps() + len(SCRIPT)
    c.postprocess_episode(ep, is_done=True, check_dones=True)
    c.postprocess_episode(single, is_done=False)  # continues in a cut chunk
    chunks = c.pop_built_episodes()
    assert [ch.id_ for ch in chunks] == ["ma", "sa"]
    assert_same_chunk(chunks[0], reference())
    assert chunks[0].is_numpy and chunks[0].is_terminated
    assert len(chunks[1]) == len(SCRIPT) and not chunks[1].is_done
    cont = c.episode("sa")
    assert (cont.id_, cont.env_t_started, len(cont), cont._len_lookback_buffers) == (
        "sa",
        len(SCRIPT),
        0,
        1,
    )
    assert c.total_env_steps() == 0


def test_build_multi_agent_batch_has_the_device_columns():
    c = SampleCollector(agent_ids=("x", "y"), policy_ids=("px", "py"), clip_rewards=1.0)
    ep = MultiAgentEpisode("ma")
    for _ in feed(c, ep, SCRIPT):
        pass
    batch = c.postprocess_episode(ep, is_done=True, build=True)
    assert batch.env_steps() == len(SCRIPT)
    ref = reference()
    for aid, pid in POLICY.items():
        sa, b = ref.agent_episodes[aid], batch[pid]
        n = len(sa)
        np.testing.assert_array_equal(b["obs"], np.stack(sa.get_observations()[:n]))
        np.testing.assert_array_equal(b["new_obs"], np.stack(sa.get_observations()[1:]))
        np.testing.assert_array_equal(b["actions"], sa.get_actions())
        np.testing.assert_array_equal(
            b["rewards"], np.clip(sa.get_rewards(), -1, 1)
        )  # clip_rewards=1.0
        assert b["rewards"].dtype == np.float32
        np.testing.assert_array_equal(b["t"], np.arange(n))
        np.testing.assert_array_equal(b["terminateds"], [False] * (n - 1) + [True])
        assert not b["truncateds"].any()
        assert list(b["eps_id"]) == [ep.agent_episodes[aid].id_] * n
        assert set(b["agent_index"]) == {("x", "y").index(aid)}
        np.testing.assert_array_equal(b["logp"], -np.asarray(sa.get_actions(), np.float32))
        assert b["infos"] == sa.get_infos()[:n]
    assert batch["px"]["rewards"].tolist() == [1.0, 1.0, 1.0, 1.0]  # 1.5 clipped
    assert c.total_env_steps() == 0 and c.build_multi_agent_batch().agent_steps() == 0


def test_truncated_fragments_have_exactly_rollout_fragment_length_steps():
    c = SampleCollector(rollout_fragment_length=4, agent_ids=("x",))
    fragments, eps = [], 0
    ep = MultiAgentEpisode("e0")
    first_chunks = [ep]
    c.add_init_obs(episode=ep, agent_id="x", env_id=0, policy_id="p", init_obs=o(0))
    for t in range(1, 15):
        c.get_inference_input_dict("p")
        done = t % 6 == 0  # episodes of 6 steps
        c.add_action_reward_next_obs(
            ep.id_,
            "x",
            0,
            "p",
            done,
            {"actions": t, "rewards": float(t), "new_obs": o(t), "terminateds": done},
        )
        c.episode_step(ep, terminateds={"__all__": done})
        if done:
            c.postprocess_episode(ep, is_done=True, check_dones=True)
            eps += 1
            ep = MultiAgentEpisode(f"e{eps}")
            first_chunks.append(ep)
            c.add_init_obs(episode=ep, agent_id="x", env_id=0, policy_id="p", init_obs=o(100 * eps))
        out = c.try_build_truncated_episode_multi_agent_batch()
        assert out == [] or t % 4 == 0
        fragments += out
    assert len(fragments) == 3
    names = {
        first_chunks[k].agent_episodes["x"].id_: f"e{k}" for k in range(2)
    }  # eps_id: the agent's episode id
    rows = [
        (names[e], int(tt), int(a))
        for f in fragments
        for e, tt, a in zip(f["p"]["eps_id"], f["p"]["t"], f["p"]["actions"], strict=True)
    ]
    assert all(f.env_steps() == 4 for f in fragments)
    # Every step exactly once, episodes continue across fragments with their ids and t.
    assert rows == [("e0", t, t + 1) for t in range(6)] + [("e1", t, t + 7) for t in range(6)]
    dones = np.concatenate([f["p"]["terminateds"] for f in fragments])
    assert dones.nonzero()[0].tolist() == [5, 11]


def test_count_by_agent_steps():
    c = SampleCollector(
        rollout_fragment_length=5, count_steps_by="agent_steps", agent_ids=("x", "y")
    )
    ep = MultiAgentEpisode("ma")
    built = []
    for _ in feed(c, ep, SCRIPT[:3]):
        built += c.try_build_truncated_episode_multi_agent_batch()
    assert built == [] and c.total_agent_steps() == 3  # x: 2 steps, y: 1
    for _ in feed(c, MultiAgentEpisode("mb"), SCRIPT[:2]):
        pass
    assert c.total_agent_steps() == 4 and c.try_build_truncated_episode_multi_agent_batch() == []


def test_errors_are_clear():
    c = SampleCollector()
    ep = MultiAgentEpisode("ma")
    c.add_init_obs(episode=ep, agent_id="x", env_id=0, policy_id="p", init_obs=o(0))
    with pytest.raises(ValueError, match="already has an observation"):
        c.add_init_obs(episode=ep, agent_id="x", env_id=0, policy_id="p", init_obs=o(0))
    with pytest.raises(ValueError, match="mapped to policy 'p'"):
        c.add_action_reward_next_obs("ma", "x", 0, "q", False, {"actions": 0})
    with pytest.raises(ValueError, match="runs in env 0"):
        c.add_action_reward_next_obs("ma", "x", 3, "p", False, {"actions": 0})
    with pytest.raises(KeyError, match="unknown or finished episode 'nope'"):
        c.episode_step("nope")
    c.add_action_reward_next_obs(
        "ma", "x", 0, "p", False, {"actions": 0, "rewards": 1.0, "new_obs": o(1)}
    )
    with pytest.raises(RuntimeError, match="call episode_step"):
        c.get_inference_input_dict("p")
    with pytest.raises(RuntimeError, match="call episode_step"):
        c.postprocess_episode(ep)
    c.episode_step(ep)
    with pytest.raises(ValueError, match="is not done"):
        c.postprocess_episode(ep, is_done=True, check_dones=True)
    with pytest.raises(ValueError, match="rollout_fragment_length"):
        SampleCollector(rollout_fragment_length=0)
    with pytest.raises(ValueError, match="count_steps_by"):
        SampleCollector(count_steps_by="episodes")


def test_episodes_to_batch_orders_rows_by_chunk_then_agent():
    ref = reference()
    batch = episodes_to_batch([ref, ref], agent_ids=("y", "x"), policy_ids=("py",))
    assert list(batch.policy_batches) == ["py", "px"]
    assert batch.env_steps() == 2 * len(SCRIPT)
    assert list(batch["px"]["agent_index"]) == [1] * 2 * len(ref.agent_episodes["x"])
