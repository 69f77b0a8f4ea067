"""The floor plan holds: a narrow sorted top level, rooms a person can hold, no import
circle, and one list of layers shared by docs/layout.md and the import-linter contract."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import grimp
import jax
import numpy as np
import pytest
import tomllib

import jaxsampler as js
from tests.fakes import FakeEnv

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxsampler"


def test_top_level_is_narrow_sorted_and_complete():
    assert len(js.__all__) <= 36  # 35 + js.to_gymnasium, the API surface DESIGN.md names
    assert js.__all__ == sorted(js.__all__)
    for name in js.__all__:
        assert getattr(js, name) is not None, name


@pytest.mark.parametrize(
    "name, home",
    [
        ("InfiniteLookbackBuffer", "jaxsampler.episodes"),
        ("SamplerMetrics", "jaxsampler.sampling"),
        ("from_gymnax", "jaxsampler.envs"),
        ("record_video", "jaxsampler.integrations"),
        ("DEFAULT_POLICY_ID", "jaxsampler.constants"),
        ("checkpoint", "jaxsampler.rollout"),
        ("loggers", "jaxsampler.integrations"),
    ],
)
def test_moved_names_resolve_with_a_deprecation_warning(name, home):
    assert name not in js.__all__
    with pytest.warns(DeprecationWarning, match=rf"jaxsampler\.{name} moved: use {home}\.{name}"):
        old = getattr(js, name)
    assert old is getattr(sys.modules[home], name)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        js.nope  # noqa: B018


def test_make_sharded_rollout_is_a_deprecated_alias_of_mesh():
    from jaxsampler.rollout import placement

    env = FakeEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    mesh = placement.env_mesh(1)
    with pytest.warns(DeprecationWarning, match="mesh=mesh"):
        old = js.make_sharded_rollout(env, pol, 2, 3, mesh)
    new = js.make_rollout(env, pol, 2, 3, mesh=mesh)
    key = jax.random.PRNGKey(0)
    _, a = old((), old.init(key))
    _, b = new((), new.init(key))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_no_module_over_800_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 800
    }
    assert not long, f"modules over 800 lines: {long}"


def _cycles(graph: grimp.ImportGraph) -> list[set[str]]:
    """Strongly connected components (more than one module) of the import graph."""
    adj = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:  # iterative Tarjan would be longer; the graph is small
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for m in sorted(adj):
        if m not in index:
            visit(m)
    return found


def test_no_import_circle_lazy_imports_included():
    # grimp reads every import statement, those inside functions too.
    graph = grimp.build_graph("jaxsampler")
    assert _cycles(graph) == []


def _contract_layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = config["tool"]["importlinter"]["contracts"][0]
    assert contract["type"] == "layers"
    return [
        {m.strip().removeprefix("jaxsampler.") for m in re.split(r"[|:]", row)}
        for row in contract["layers"]
    ]


def _docs_layers() -> list[set[str]]:
    table = (ROOT / "docs" / "layout.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    layers = []
    for row in rows:
        if not row.startswith("| ") or row.startswith("|---"):
            break
        where = row.split("|")[2]
        paths = re.findall(r"`jaxsampler/([\w/]+?)(?:\.py|/)`", where)
        layers.append({p.replace("/", ".") for p in paths})
    return layers


def test_docs_layout_table_and_contract_list_the_same_rows_in_order():
    assert _docs_layers() == _contract_layers()


def test_every_package_module_sits_in_a_layer():
    layered = set().union(*_contract_layers())
    tops = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()}
    tops = {t for t in tops if not t.startswith("__") and t != "py.typed"}
    assert tops <= layered, f"outside every layer: {sorted(tops - layered)}"


def test_gym_ids_resolve_through_the_kind_host_envs_adds():
    from jaxsampler.envs import registry

    assert "gym" in registry.KINDS
    env = js.make("gym:CartPole-v1", num_envs=2, seed=3)
    try:
        assert isinstance(env, js.host_envs.GymnasiumHostEnv) and env.num_envs == 2
    finally:
        env.close()
    with pytest.raises(ValueError, match="a suite's prefix"):
        registry.register_kind("gymnax", lambda i: i)


@pytest.mark.parametrize(
    "old, new, name",
    [
        ("jaxsampler.placement", "jaxsampler.rollout.placement", "env_mesh"),
        ("jaxsampler.checkpoint", "jaxsampler.rollout.checkpoint", "Checkpoints"),
        ("jaxsampler.loggers", "jaxsampler.integrations.loggers", "JsonlLogger"),
        ("jaxsampler.codec", "jaxsampler.episodes.codec", "packb"),
        ("jaxsampler.rllib.convert", "jaxsampler.integrations.rllib.convert", "to_rllib"),
    ],
)
def test_moved_module_paths_import_with_a_deprecation_warning(monkeypatch, old, new, name):
    import importlib

    for m in [m for m in sys.modules if m == old or m.startswith(old + ".")]:
        monkeypatch.delitem(sys.modules, m)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        alias = importlib.import_module(old)
    assert getattr(alias, name) is getattr(importlib.import_module(new), name)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("jaxsampler.no_such_module")
