"""Adapter: pgx envs as jaxsampler envs (being written: issue 17)."""

from __future__ import annotations

from typing import Any

from jaxsampler.envs.adapters.common import SuiteEnv

__all__ = ["PgxEnv", "from_pgx", "make_pgx"]


class PgxEnv(SuiteEnv):
    suite = "pgx"


def from_pgx(env: Any, params: Any = None, env_id: str | None = None) -> PgxEnv:
    raise NotImplementedError


def make_pgx(env_id: str, **kwargs: Any) -> PgxEnv:
    raise NotImplementedError
