"""Property tests: random add/cut/getter sequences vs a plain-list model of an episode.

The model keeps the whole episode as three Python lists (the full timeline) plus the
current chunk's ``t_started`` and lookback size, and answers every getter from those
lists with RLlib's index rules written out directly.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jaxsampler import SingleAgentEpisode


class Model:
    def __init__(self):
        self.obs, self.act, self.rew = [0], [], []
        self.t_started, self.lb = 0, 0

    @property
    def t(self):
        return len(self.act)

    def data(self, col):
        lo = self.t_started - self.lb
        if col == "obs":
            return self.obs[lo : self.t + 1]
        return (self.act if col == "act" else self.rew)[lo : self.t]

    def get_int(self, col, i, nial, fill):
        d = self.data(col)
        pos = self.lb + i if (i >= 0 or nial) else len(d) + i
        if 0 <= pos < len(d):
            return d[pos]
        if fill is None:
            raise IndexError
        return fill

    def get_slice(self, col, a, b, nial, fill):
        d, lb = self.data(col), self.lb
        n = len(d)
        start = lb if a is None else (lb + a if (a >= 0 or nial) else n + a)
        stop = n if b is None else (lb + b if (b >= 0 or nial) else n + b)
        if fill is None:
            return d[max(start, 0) : max(stop, 0)]
        # RLlib 2.60's fill counts: both ends on one side of the data fill |start - stop|
        # items there (a reversed range too); a start before the data fills the left
        # only; a stop past the end fills the right; a stop before the data with the
        # start inside fills -stop - 1 on the right (plus start - N + 1 on the left for a
        # start past the end).
        if (start < 0 and stop < 0) or (start >= n and stop >= n):
            return [fill] * abs(start - stop)
        if start < 0:
            return [fill] * (-start) + d[0:stop]
        if stop >= n:
            return d[start:n] + [fill] * (stop - n)
        if stop < 0:
            return [fill] * (max(start - n + 1, 0) + (-stop - 1))
        return d[start:stop]

    def cut(self, n):
        # The successor's lookback can reach into this chunk's own lookback, no further.
        self.lb = min(n, self.lb + self.t - self.t_started)
        self.t_started = self.t


ops = st.lists(
    st.one_of(
        st.tuples(st.just("step")),
        st.tuples(st.just("cut"), st.integers(0, 4)),
        st.tuples(
            st.just("int"),
            st.sampled_from(["obs", "act", "rew"]),
            st.integers(-8, 8),
            st.booleans(),
            st.sampled_from([None, -1]),
        ),
        st.tuples(
            st.just("slice"),
            st.sampled_from(["obs", "act", "rew"]),
            st.one_of(st.none(), st.integers(-8, 8)),
            st.one_of(st.none(), st.integers(-8, 8)),
            st.booleans(),
            st.sampled_from([None, -1]),
        ),
    ),
    max_size=40,
)


def as_list(x):
    return np.asarray(x).tolist() if isinstance(x, np.ndarray) else list(x)


def test_model_catches_chained_lookback():
    """A fixed sequence whose answer depends on how far a cut chunk's lookback reaches."""
    ep = SingleAgentEpisode(id_="m")
    ep.add_env_reset(0)
    for k in range(1, 6):
        ep.add_env_step(k, 100 + k, float(k))
    ep = ep.cut(0)
    ep.add_env_step(6, 106, 6.0)
    ep = ep.cut(4)
    assert ep.observations.lookback == 1  # only 1 step was kept after cut(0)
    assert (
        ep.get_observations(slice(-4, None), neg_index_as_lookback=True, fill=-1).tolist()
        if ep.is_numpy
        else ep.get_observations(slice(-4, None), neg_index_as_lookback=True, fill=-1)
        == [-1, -1, -1, 5, 6]
    )


@settings(max_examples=300, deadline=None)
@given(ops, st.booleans())
@example(
    [("step",)] * 5 + [("cut", 0), ("step",), ("cut", 4), ("slice", "obs", -4, None, True, -1)],
    False,
)
@example(
    [("step",)] * 3
    + [("cut", 2), ("int", "act", -2, True, None), ("slice", "rew", -3, 2, False, -1)],
    True,
)
def test_episode_matches_plain_list_model(operations, numpy_mode):
    model = Model()
    ep = SingleAgentEpisode(id_="m")
    ep.add_env_reset(0)
    getters = {"obs": ep.get_observations, "act": ep.get_actions, "rew": ep.get_rewards}
    for op in operations:
        getters = {"obs": ep.get_observations, "act": ep.get_actions, "rew": ep.get_rewards}
        if op[0] == "step":
            k = len(model.act) + 1
            ep.add_env_step(k, 100 + k, float(k))
            model.obs.append(k)
            model.act.append(100 + k)
            model.rew.append(float(k))
        elif op[0] == "cut":
            ep = ep.cut(len_lookback_buffer=op[1])
            model.cut(op[1])
        elif op[0] == "int":
            _, col, i, nial, fill = op
            try:
                want = model.get_int(col, i, nial, fill)
            except IndexError:
                want = IndexError
            try:
                got = getters[col](i, neg_index_as_lookback=nial, fill=fill)
            except IndexError:
                got = IndexError
            assert (got is IndexError) == (want is IndexError), (op, got, want)
            if want is not IndexError:
                assert float(np.asarray(got)) == float(want), (op, got, want)
        else:
            _, col, a, b, nial, fill = op
            got = as_list(getters[col](slice(a, b), neg_index_as_lookback=nial, fill=fill))
            want = model.get_slice(col, a, b, nial, fill)
            assert [float(np.asarray(x)) for x in got] == [float(x) for x in want], (op, got, want)
        assert len(ep) == model.t - model.t_started
        assert (ep.t, ep.t_started) == (model.t, model.t_started)
        assert float(ep.get_return()) == sum(model.rew[model.t_started :])
        if numpy_mode and len(ep) > 0 and not ep.is_numpy:
            ep.to_numpy()  # numpy'ized episodes keep answering the same
