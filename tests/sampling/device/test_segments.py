"""``find_segments`` against a step-by-step Python reference on random calls: segments
(their order, starts, lengths, counts, lookbacks, ends), returns, carried partial returns
and the call's metrics."""

from __future__ import annotations

import numpy as np
import pytest

from jaxsampler.sampling.device.columns import find_segments


def _random_call(rng: np.random.Generator, E: int, H: int, T: int) -> dict:
    """Env-level columns ``[E, H + T]`` with next-step auto-reset: a step after a done
    step is a reset step (not live); a few envs also start the call on a reset."""
    is_reset = np.zeros((E, H + T), bool)
    term = rng.random((E, H + T)) < 0.08
    trunc = ~term & (rng.random((E, H + T)) < 0.04)
    for e in range(E):
        for j in range(1, H + T):
            if (term[e, j - 1] or trunc[e, j - 1]) and not is_reset[e, j - 1]:
                is_reset[e, j] = True
        if rng.random() < 0.2:
            is_reset[e, H] = True
    term &= ~is_reset
    trunc &= ~is_reset
    step0 = np.where(is_reset[:, H], 0, rng.integers(0, 6, E))
    return dict(
        is_reset=is_reset,
        terminated=term,
        truncated=trunc,
        rewards=rng.normal(size=(E, H + T)).astype(np.float32),
        horizon=H,
        step0=step0,
        count0=rng.integers(0, 50, E),
        partial_return=np.where(step0 > 0, rng.normal(size=E), 0.0),
    )


def _reference(c: dict, fresh: bool) -> tuple[list[dict], np.ndarray]:
    """Segments as a loop over each env's steps finds them (output order: finished ones,
    then the others, each by env and start), and the returns carried on."""
    H = c["horizon"]
    E, S = c["is_reset"].shape
    found, carried = [], np.zeros(E)
    for e in range(E):
        count = int(c["count0"][e])
        j = 0
        while j < S - H:
            if c["is_reset"][e, H + j]:
                count += 1
                j += 1
                continue
            start, ret = j, 0.0
            while True:
                ret += float(c["rewards"][e, H + j])
                done = bool(c["terminated"][e, H + j] or c["truncated"][e, H + j])
                if done or j + 1 == S - H or c["is_reset"][e, H + j + 1]:
                    break
                j += 1
            step0 = int(c["step0"][e])
            cont = start == 0 and step0 > 0
            if cont:
                ret += float(c["partial_return"][e])
            seg = dict(
                env=e,
                start=start,
                len=j - start + 1,
                lookback=min(0 if fresh else H, step0) if cont else 0,
                t_started=step0 if cont else 0,
                term=bool(c["terminated"][e, H + j]) and done,
                trunc=bool(c["truncated"][e, H + j]) and done,
                count=count,
                ret=ret,
                done=done,
            )
            found.append(seg)
            if not done and j + 1 == S - H:
                carried[e] = ret
            j += 1
    order = [s for s in found if s["done"]] + [s for s in found if not s["done"]]
    return order, carried


@pytest.mark.parametrize("seed", range(12))
def test_segments_match_a_step_by_step_reference(seed):
    rng = np.random.default_rng(seed)
    E, H, T = int(rng.integers(1, 9)), int(rng.integers(0, 3)), int(rng.integers(1, 30))
    c = _random_call(rng, E, H, T)
    fresh = bool(seed % 2)
    seg, m, carried = find_segments(**c, fresh=fresh, num_episodes=None).summarized()
    ref, ref_carried = _reference(c, fresh)
    for name in ("env", "start", "len", "lookback", "t_started", "term", "trunc", "count"):
        assert getattr(seg, name).tolist() == [s[name] for s in ref], name
    np.testing.assert_allclose(carried, ref_carried, rtol=1e-12, atol=1e-12)
    fin = [s for s in ref if s["done"]]
    assert m.num_episodes_completed == len(fin)
    assert m.num_env_steps_sampled == int((~c["is_reset"][:, H:]).sum())
    assert m.num_episodes_ongoing == len(ref) - len(fin)
    if fin:
        np.testing.assert_allclose(m.episode_return_mean, np.mean([s["ret"] for s in fin]))
        lengths = [s["t_started"] + s["len"] for s in fin]
        assert (m.episode_len_min, m.episode_len_max) == (min(lengths), max(lengths))


def test_no_live_step_gives_no_segment():
    E, T = 3, 4
    seg, m, carried = find_segments(
        np.ones((E, T), bool),
        np.zeros((E, T), bool),
        np.zeros((E, T), bool),
        np.ones((E, T), np.float32),
        horizon=0,
        step0=np.zeros(E, np.int64),
        count0=np.zeros(E, np.int64),
        fresh=True,
        partial_return=np.zeros(E),
        num_episodes=None,
    ).summarized()
    assert len(seg) == 0 and m.num_env_steps_sampled == 0 and not carried.any()
