"""Adapter: brax envs as jaxsampler envs (being written: issue 17)."""

from __future__ import annotations

from typing import Any

from jaxsampler.envs.adapters.common import SuiteEnv

__all__ = ["BraxEnv", "from_brax", "make_brax"]


class BraxEnv(SuiteEnv):
    suite = "brax"


def from_brax(env: Any, params: Any = None, env_id: str | None = None) -> BraxEnv:
    raise NotImplementedError


def make_brax(env_id: str, **kwargs: Any) -> BraxEnv:
    raise NotImplementedError
