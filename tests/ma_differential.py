"""Random multi-agent call sequences run on two ``MultiAgentEpisode`` classes side by side.

Used by ``tests/episodes/test_rllib_differential_ma.py`` (jaxsampler's class against RLlib's own)
and runnable as a script for a broader exploratory run that prints the match rate::

    python -m tests.ma_differential 400

A program is driven by a ``numpy`` generator: agents join (with rewards before their
first observation), act, hang (act without a next observation, collecting rewards),
complete, terminate with or without a final observation, get truncated; the episode may
end with ``__all__``, may be ``cut`` with a lookback and continued, and may be
numpy'ized. After every step a batch of random getter calls (env steps and agent steps,
int/list/slice indices, ``neg_index_as_lookback``, ``fill``, ``return_list``, agent
subsets) is made on both episodes and the results are compared.

The comparison leaves out exactly the RLlib 2.60 bugs that jaxsampler does not copy
(numbered as the "RLlib deviation (n)" notes in ``jaxsampler/episodes/``; :func:`excluded`
and the excuses in :meth:`Program.getters` say which one a call falls under), plus the
lookback buffers' own fill rule for slices reaching outside the data ("buffer": an
``InfiniteLookbackBuffer`` matter, not a multi-agent one). The generator avoids the
situations of bugs 4 and 8 and of the two documented design differences (done agents in
a cut successor, an agent joining when every other one is done).
"""

from __future__ import annotations

import copy
import sys
from collections import Counter
from typing import Any

import numpy as np

AGENTS = ("a0", "a1", "a2", "a3")


def normalize(x: Any) -> Any:
    """A comparable form of a getter result: containers recursively, numpy values with
    their dtype (so that a float32 and a float64 array differ)."""
    if isinstance(x, dict):
        return {"<dict>": sorted(((repr(k), normalize(v)) for k, v in x.items()))}
    if isinstance(x, (list, tuple)):
        return [normalize(v) for v in x]
    if isinstance(x, np.ndarray):
        return ("nd", x.dtype.str, x.shape, normalize(x.tolist()))
    if isinstance(x, np.generic):
        return ("np", x.dtype.str, x.item())
    if isinstance(x, float):
        return ("f", x)
    return x


def loose(x: Any) -> Any:
    """``normalize`` without array types: lists and arrays alike (RLlib's ``np.append``
    quirk turns some lists into arrays)."""
    if isinstance(x, dict):
        # (RLlib's np.append keeps an empty array where it leaves an empty list out)
        items = [(k, v) for k, v in x.items() if not (isinstance(v, np.ndarray) and v.size == 0)]
        return {"<dict>": sorted(((repr(k), loose(v)) for k, v in items))}
    if isinstance(x, np.ndarray):
        return loose(x.tolist())
    if isinstance(x, (list, tuple)):
        return [loose(v) for v in x]
    if isinstance(x, np.generic):
        return float(x.item())
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    return x


def call(f: Any) -> Any:
    try:
        return ("ok", f())
    except Exception as e:  # the exception type is part of the behaviour
        return ("raise", type(e).__name__)


class Program:
    """One random program, applied step by step to both episodes (``ref`` and ``got``)."""

    def __init__(self, seed: int, ref_cls: Any, got_cls: Any):
        self.rng = np.random.default_rng(seed)
        self.ref_cls, self.got_cls = ref_cls, got_cls
        self.t = 0
        self.status: dict[str, str] = {}  # agent -> "obs" | "hang" | "done"
        self.term_no_obs: set[str] = set()  # agents terminated without a final observation
        self.joined_after_cut: set[str] = set()  # agents that joined a cut chunk
        self.cut = False
        # the hanging rewards at the last cut, which RLlib's successor copies (bug 5)
        self.copied_at_cut: dict[str, float] = {}
        self.numpy = False
        self.mismatches: list[tuple[str, Any, Any]] = []
        self.counts: Counter = Counter()

    # -- stepping -------------------------------------------------------------------

    def obs(self, a: str) -> int:
        return 100 * AGENTS.index(a) + self.t

    def start(self) -> None:
        first = [a for a in AGENTS if self.rng.random() < 0.6] or ["a0"]
        obs = {a: self.obs(a) for a in first}
        infos = {a: {"t": self.t} for a in first if self.rng.random() < 0.5}
        self.ref, self.got = self.ref_cls(), self.got_cls()
        for ep in (self.ref, self.got):
            ep.add_env_reset(observations=copy.deepcopy(obs), infos=copy.deepcopy(infos))
        self.status = dict.fromkeys(first, "obs")

    def step(self, end: bool) -> bool:
        """One env step (``end``: the episode ends with ``__all__``); False if done."""
        rng = self.rng
        self.t += 1
        obs, act, rew, infos, extras = {}, {}, {}, {}, {}
        term, trunc = {}, {}
        all_trunc = end and rng.random() < 0.5
        joiners: list[str] = []
        for a in AGENTS:
            st = self.status.get(a)
            if st == "done":
                continue
            r = float(rng.integers(-4, 5)) / 4
            if st is None:  # not started: join, or a reward before the first observation
                u = rng.random()
                if u < 0.3 and not end:
                    obs[a] = self.obs(a)
                    joiners.append(a)
                    if self.cut:
                        self.joined_after_cut.add(a)
                    if rng.random() < 0.5:
                        rew[a] = r
                    self.status[a] = "obs"
                elif u < 0.5:
                    rew[a] = r
                continue
            if st == "obs":  # the env contract: it acts on its observation
                act[a] = int(rng.integers(0, 5)) + 10 * AGENTS.index(a)
                extras[a] = {"vf": float(rng.integers(0, 8)) / 8, "k": int(rng.integers(0, 3))}
            u = rng.random()
            if end:
                obs[a], rew[a] = self.obs(a), r
                self.status[a] = "done"
            elif u < 0.55:  # completes its step
                obs[a], rew[a] = self.obs(a), r
                self.status[a] = "obs"
                if rng.random() < 0.1:
                    (term if rng.random() < 0.5 else trunc)[a] = True
                    self.status[a] = "done"
            elif u < 0.9:  # hangs (maybe collecting a reward)
                if rng.random() < 0.5:
                    rew[a] = r
                self.status[a] = "hang"
            elif self.cut:  # bug 10: RLlib loses the step of a cut chunk's agent here
                self.status[a] = "hang"
            else:  # terminated without a final observation
                rew[a] = r
                term[a] = True
                self.status[a] = "done"
                self.term_no_obs.add(a)
            if a in obs and rng.random() < 0.3:
                infos[a] = {"t": self.t}
        if joiners and all(s == "done" for a, s in self.status.items() if a not in joiners):
            # RLlib ends the episode when every known agent is done and ignores an agent
            # joining in that step; we let it join (and go on): not compared
            for a in joiners:
                del obs[a], self.status[a]
                rew.pop(a, None)
        if end:
            (trunc if all_trunc else term)["__all__"] = True
        outcome = []
        for ep in (self.ref, self.got):
            outcome.append(
                call(
                    lambda ep=ep: ep.add_env_step(
                        copy.deepcopy(obs),
                        copy.deepcopy(act),
                        copy.deepcopy(rew),
                        copy.deepcopy(infos),
                        terminateds=dict(term),
                        truncateds=dict(trunc),
                        extra_model_outputs=copy.deepcopy(extras),
                    )
                )
            )
        self.counts["calls"] += 1
        if outcome[0] != outcome[1]:
            self.mismatches.append(("add_env_step", outcome[0], outcome[1]))
        if outcome[0][0] == "raise" or outcome[1][0] == "raise":
            return False
        self.check("is_done", lambda ep: (ep.is_done, ep.is_terminated))
        return not (self.ref.is_done or self.got.is_done)

    def maybe_cut(self) -> None:
        hanging = any(s == "hang" for s in self.status.values())
        lb = int(self.rng.integers(1 if hanging else 0, 4))  # cut(0) with hanging: bug 4
        self.copied_at_cut = dict(self.ref._hanging_rewards_end)
        self.ref, self.got = self.ref.cut(lb), self.got.cut(lb)
        self.cut = True

    # -- comparing ------------------------------------------------------------------

    def check(self, label: str, f: Any, strict: bool = True, excuse: Any = None) -> None:
        """Compares ``f`` on both episodes; ``excuse(ref_result, our_result)`` names the
        documented RLlib bug behind a difference (then it is counted as excluded)."""
        r, g = call(lambda: f(self.ref)), call(lambda: f(self.got))
        norm = normalize if strict else loose
        if norm(r) != norm(g):
            reason = excuse(r, g) if excuse is not None else None
            if reason:
                self.counts[f"excluded: {reason}"] += 1
                return
            self.mismatches.append((label, r, g))
        self.counts["calls"] += 1

    def getters(self, n: int) -> None:
        rng = self.rng
        for _ in range(n):
            what = str(
                rng.choice(["observations", "infos", "actions", "rewards", "extra_model_outputs"])
            )
            env_steps = bool(rng.random() < 0.6)
            length = len(self.ref) + 3
            kind = rng.integers(0, 4)
            if kind == 0:
                idx: Any = None
            elif kind == 1:
                idx = int(rng.integers(-length, length))
            elif kind == 2:
                idx = [int(i) for i in rng.integers(-length, length, size=rng.integers(1, 4))]
            else:
                lo = int(rng.integers(-length, length))
                idx = slice(lo, None if rng.random() < 0.3 else int(rng.integers(lo, length + 1)))
            kw: dict[str, Any] = {"env_steps": env_steps}
            if rng.random() < 0.4:
                kw["neg_index_as_lookback"] = True
            if rng.random() < 0.3 and idx is not None:
                kw["fill"] = -9 if what != "infos" else {"f": 1}
            if env_steps and not isinstance(idx, int) and rng.random() < 0.2:
                # (RLlib asserts that return_list has list or slice indices)
                kw["return_list"] = True
            if rng.random() < 0.3:
                kw["agent_ids"] = [a for a in AGENTS if rng.random() < 0.5]
            key = str(rng.choice(["vf", "k"])) if what == "extra_model_outputs" else None
            label = f"get_{what}({key=}, {idx=}, {kw})"
            reason = excluded(self, what, idx, kw)
            if reason:
                self.counts[f"excluded: {reason}"] += 1
                continue

            def f(ep: Any, what=what, idx=idx, kw=kw, key=key) -> Any:
                kw = dict(kw)
                left_out = self.term_no_obs | self.joined_after_cut
                if left_out and kw["env_steps"]:
                    # bugs 9 and 11: leave those agents out of env-step getters
                    ids = kw.get("agent_ids") or AGENTS
                    kw["agent_ids"] = [a for a in ids if a not in left_out]
                    if not kw["agent_ids"]:
                        return None
                if what == "extra_model_outputs":
                    return ep.get_extra_model_outputs(key, idx, **kw)
                return getattr(ep, "get_" + what)(idx, **kw)

            def excuse(r: Any, g: Any, what=what, env_steps=env_steps, kw=kw) -> str | None:
                if what == "extra_model_outputs" and _extras_key_error(r):
                    return _extras_key_error(r)
                if wraps_past_lookback(self.ref, r, g, what, env_steps, kw):
                    return "B1 (numpy'ized: an index past the lookback wraps to the end)"
                if self.cut and env_steps and kw.get("neg_index_as_lookback"):
                    return "16 (cut's lookback is not clipped: lookback indices differ)"
                if self.cut and env_steps and r[0] == "ok" and g == ("raise", "IndexError"):
                    return "16 (cut's lookback is not clipped: padded empty env steps)"
                if self.cut and not env_steps and what == "rewards":
                    return "16 (cut's lookback is not clipped: 0.0 hanging rewards)"
                return None

            # bug 14: RLlib's dtype of numpy'ized rewards with fill is the first item's
            # (float32 if that is a fill value, else float64): values compared only
            fill_dtype = self.numpy and what == "rewards" and "fill" in kw
            strict = not (_np_append_quirk(self, what, idx, kw) or fill_dtype)
            self.check(label, f, strict=strict, excuse=excuse)

    def double_counted(self) -> float:
        """What RLlib's ``get_return(include_hanging_rewards=True)`` counts twice (bug 5):
        the copies of the rewards hanging at the last cut that its begin cache still holds
        (it drops an agent's entry when the agent is done)."""
        begin = self.ref._hanging_rewards_begin
        return float(sum(v for a, v in self.copied_at_cut.items() if a in begin))

    def summary_checks(self) -> None:
        self.check("len", lambda ep: (len(ep), ep.env_t, ep.env_t_started))
        self.check("agent_steps", lambda ep: ep.agent_steps())
        self.check("agent_ids", lambda ep: sorted(ep.agent_ids))
        self.check("get_return", lambda ep: ep.get_return())

        # bug 5: RLlib's cut() successor counts the rewards that were hanging at the cut
        # twice (copied into its begin cache, kept there until the agent is done): compared
        # less that copy
        def ret(ep: Any) -> Any:
            r = ep.get_return(include_hanging_rewards=True)
            twice = self.double_counted() if ep is self.ref else 0.0
            return r - twice if twice else r

        self.check("get_return(True)", ret)
        self.check("get_terminateds", lambda ep: ep.get_terminateds())
        self.check(  # bug 3: get_truncateds()["__all__"]
            "get_truncateds",
            lambda ep: {a: v for a, v in ep.get_truncateds().items() if a != "__all__"},
        )
        self.check("agents_to_act", lambda ep: sorted(ep.get_agents_to_act()))
        self.check(  # bug 9: RLlib maps a re-recorded final observation to the next step
            "agents_that_stepped",
            lambda ep: sorted(set(ep.get_agents_that_stepped()) - self.term_no_obs),
        )
        # (RLlib's getters add keys to this defaultdict: compare its values)
        self.check("agent_t_started", lambda ep: [ep.agent_t_started.get(a, 0) for a in AGENTS])
        self.check(
            "sa_lengths", lambda ep: sorted((a, len(s)) for a, s in ep.agent_episodes.items())
        )
        self.check(
            "sa_rewards",
            lambda ep: sorted((a, s.get_return()) for a, s in ep.agent_episodes.items()),
        )

    def run(self, max_steps: int = 12, n_getters: int = 12) -> Program:
        self.start()
        steps = int(self.rng.integers(2, max_steps))
        for i in range(steps):
            end = i == steps - 1 and self.rng.random() < 0.5
            alive = self.step(end)
            self.getters(n_getters)
            self.summary_checks()
            if not alive:
                break
            # (RLlib's cut() carries done agents over as len-0 agents; ours does not)
            no_done = "done" not in self.status.values()
            if i < steps - 1 and no_done and self.rng.random() < 0.25:
                self.maybe_cut()
                self.getters(n_getters)
        lens = [len(s) for s in self.ref.agent_episodes.values()]
        if lens and min(lens) > 0 and self.rng.random() < 0.5:  # bug 8: len-0 agents
            self.ref.to_numpy()
            self.got.to_numpy()
            self.numpy = True
            self.getters(n_getters * 2)
            self.summary_checks()
        return self


def excluded(p: Program, what: str, idx: Any, kw: dict) -> str | None:
    """The documented RLlib 2.60 bug a getter call falls under (None: compared)."""
    env_steps = kw["env_steps"]
    ep = p.ref
    if p.cut and env_steps and what in ("actions", "rewards", "extra_model_outputs"):
        return "1 (env-step getters on cut chunks)"
    if what == "extra_model_outputs" and not env_steps:
        return "2 (agent-step extras raise TypeError)"
    if not env_steps and kw.get("neg_index_as_lookback") and what not in ("observations", "infos"):
        # (observations and infos have no hanging value: compared, see B1 in the excuses)
        return "12 (agent-step lookback indices resolved against a cached hanging value)"
    filled = "fill" in kw or kw.get("return_list")  # (per-step lists fill with skips)
    if isinstance(idx, slice) and filled and _outside(p, idx, kw, env_steps):
        return "buffer (slices reaching outside the data with fill, InfiniteLookbackBuffer)"
    if what == "infos" and "fill" in kw and p.numpy:
        return "15 (numpy'ized info getters with fill batch the fill dicts or raise)"
    del ep
    return None


def _outside(p: Program, idx: slice, kw: dict, env_steps: bool) -> bool:
    """Whether a slice may reach outside the data (env steps: the chunk's; agent steps:
    any agent's), where the lookback buffers' fill rules for slices apply."""
    if not env_steps:
        return True
    n = len(p.ref) + 1
    lb = p.ref._len_lookback_buffers
    lo = -lb if kw.get("neg_index_as_lookback") else -n
    ends = [idx.start] + ([idx.stop] if idx.stop is not None else [])
    return any(not lo <= e <= n - 1 for e in ends) or (idx.stop is not None and idx.stop > n)


def wraps_past_lookback(ref: Any, r: Any, g: Any, what: str, env_steps: bool, kw: dict) -> bool:
    """RLlib deviation (B1) of the lookback buffer: an agent-step observation or info
    index with ``neg_index_as_lookback`` reaching past an agent's lookback returns an item
    from the end of the data on RLlib's numpy'ized buffers (a fast path that skips the
    range check; RLlib's list-mode buffers raise ``IndexError``, as ours do in both)."""
    numpyized = any(sa.observations.finalized for sa in ref.agent_episodes.values())
    return (
        numpyized
        and not env_steps
        and bool(kw.get("neg_index_as_lookback"))
        and what in ("observations", "infos")
        and r[0] == "ok"
        and g == ("raise", "IndexError")
    )


def _extras_key_error(ref_result: Any) -> str | None:
    if ref_result == ("raise", "KeyError"):
        return "7 (extras of hanging-only agents raise KeyError)"
    if ref_result == ("raise", "AttributeError"):
        return "13 (env-step extras with fill raise AttributeError)"
    return None


def _np_append_quirk(p: Program, what: str, idx: Any, kw: dict) -> bool:
    """RLlib returns an ndarray (``np.append``) for hanging agents' agent-step slices of
    list-mode episodes; compare values only there."""
    return (
        not p.numpy
        and not kw["env_steps"]
        and isinstance(idx, (slice, list))
        and bool(p.ref._hanging_actions_end)
    )


def explore(
    n: int, ref_cls: Any, got_cls: Any, verbose: int = 0
) -> tuple[int, int, Counter, Counter]:
    """Runs ``n`` programs; returns (calls, mismatching calls, mismatches by call,
    excluded calls by bug)."""
    calls = bad = 0
    kinds: Counter = Counter()
    excl: Counter = Counter()
    shown = 0
    for seed in range(n):
        p = Program(seed, ref_cls, got_cls).run()
        calls += p.counts["calls"]
        bad += len(p.mismatches)
        for k, v in p.counts.items():
            if k.startswith("excluded"):
                excl[k] += v
        for label, r, g in p.mismatches:
            kinds[label.split("(")[0]] += 1
            if shown < verbose:
                shown += 1
                print(f"seed {seed}: {label}\n   rllib: {r}\n   ours:  {g}")
    return calls, bad, kinds, excl


if __name__ == "__main__":  # pragma: no cover - the exploratory run
    import warnings

    warnings.filterwarnings("ignore")
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RLlibEpisode

    from jaxsampler.episodes.multi_agent import MultiAgentEpisode

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    verbose = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    calls, bad, kinds, excl = explore(n, RLlibEpisode, MultiAgentEpisode, verbose)
    print(
        f"{n} programs, {calls} compared calls, {bad} mismatches: match rate {1 - bad / calls:.4f}"
    )
    print("mismatches by call:", dict(kinds.most_common()))
    print("excluded:", dict(excl))
