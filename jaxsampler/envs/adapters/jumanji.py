"""Adapter: jumanji envs as jaxsampler envs (being written: issue 17)."""

from __future__ import annotations

from typing import Any

from jaxsampler.envs.adapters.common import SuiteEnv

__all__ = ["JumanjiEnv", "from_jumanji", "make_jumanji"]


class JumanjiEnv(SuiteEnv):
    suite = "jumanji"


def from_jumanji(env: Any, params: Any = None, env_id: str | None = None) -> JumanjiEnv:
    raise NotImplementedError


def make_jumanji(env_id: str, **kwargs: Any) -> JumanjiEnv:
    raise NotImplementedError
