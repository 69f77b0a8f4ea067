"""``python -m jaxsampler.launch -n N script.py [args...]``: N local processes of one program,
joined by :func:`jaxsampler.distributed.initialize`."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    raise NotImplementedError("jaxsampler.launch is being written")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
