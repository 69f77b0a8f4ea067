"""Raster primitives for env renders: small pure functions in JAX, jittable and vmappable.

A frame is ``uint8[H, W, 3]`` (RGB). A shape is drawn by computing a boolean mask over
the pixel grid (``bool[H, W]``) and compositing a color where it is True with
:func:`paint`; later paints cover earlier ones. Nothing loops over pixels, so a render is
a handful of whole-array operations, and ``jax.vmap`` over a batch of states renders a
batch of frames in one call.

Pixel coordinates: ``x`` to the right, ``y`` down, in pixels. Pixel ``(row i, column j)``
covers ``[j, j + 1) x [i, i + 1)``, so its center is ``(j + 0.5, i + 0.5)``; a shape
covers a pixel when it contains the pixel's center. Positions and sizes may be Python
floats or traced JAX scalars (they may depend on the state or the params); the image
size ``shape = (H, W)`` is static (a Python tuple). :class:`Viewport` maps world
coordinates (``y`` up) to pixel coordinates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "AGENT_COLORS",
    "BLACK",
    "BLUE",
    "DARK_GRAY",
    "GRAY",
    "GREEN",
    "LIGHT_GRAY",
    "RED",
    "WHITE",
    "YELLOW",
    "agent_color",
    "Color",
    "Viewport",
    "below_curve_mask",
    "box_mask",
    "canvas",
    "cells_image",
    "circle_mask",
    "compose",
    "curve_mask",
    "paint",
    "paint_circles",
    "pixel_centers",
    "rect_mask",
    "ring_mask",
    "segment_mask",
    "triangle_mask",
]

#: An RGB color, each channel 0..255.
Color = tuple[int, int, int]
#: A position or size: a Python number or a traced JAX scalar.
Scalar = float | jax.Array

WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
LIGHT_GRAY: Color = (220, 220, 220)
GRAY: Color = (150, 150, 150)
DARK_GRAY: Color = (60, 60, 60)
RED: Color = (220, 40, 40)
GREEN: Color = (40, 170, 60)
BLUE: Color = (40, 80, 220)
YELLOW: Color = (230, 200, 30)

#: Eight distinct colors for agents (``uint8[8, 3]``); agent ``i`` gets row ``i % 8``.
AGENT_COLORS = np.array(
    [
        (230, 25, 75),
        (60, 130, 240),
        (60, 180, 75),
        (245, 130, 48),
        (145, 30, 180),
        (70, 200, 200),
        (240, 50, 230),
        (128, 128, 0),
    ],
    np.uint8,
)


def agent_color(i: int) -> Color:
    """Agent ``i``'s color: row ``i % 8`` of :data:`AGENT_COLORS`."""
    r, g, b = (int(v) for v in AGENT_COLORS[i % len(AGENT_COLORS)])
    return (r, g, b)


def pixel_centers(shape: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
    """The pixel centers of an ``(H, W)`` image, as broadcastable coordinate arrays.

    Returns:
        ``(xs, ys)``: ``float32[1, W]`` with ``xs[0, j] = j + 0.5`` and ``float32[H, 1]``
        with ``ys[i, 0] = i + 0.5``; any arithmetic on both broadcasts to ``[H, W]``.
    """
    height, width = shape
    xs = (jnp.arange(width, dtype=jnp.float32) + 0.5)[None, :]
    ys = (jnp.arange(height, dtype=jnp.float32) + 0.5)[:, None]
    return xs, ys


def canvas(shape: tuple[int, int], color: Color = WHITE) -> jax.Array:
    """An ``(H, W)`` image filled with ``color``: ``uint8[H, W, 3]``."""
    return jnp.broadcast_to(jnp.asarray(color, jnp.uint8), (*shape, 3))


def paint(image: jax.Array, mask: jax.Array, color: Color | jax.Array) -> jax.Array:
    """``image`` (``uint8[H, W, 3]``) with ``color`` wherever ``mask`` (``bool[H, W]``) is True.

    ``color`` is an RGB triple or a ``uint8[3]`` array (which may be traced).
    """
    return jnp.where(mask[..., None], jnp.asarray(color, jnp.uint8), image)


def compose(
    shape: tuple[int, int],
    layers: Sequence[tuple[jax.Array, Color]],
    background: Color = WHITE,
) -> jax.Array:
    """Paints ``layers`` (``(mask, color)`` pairs, ``mask: bool[H, W]``) in order over a
    ``background`` canvas: the same frame as chained :func:`paint` calls, but composited
    on a one-byte layer-index plane with a single color lookup at the end, which is
    about twice as fast on CPU. Colors must be static (RGB triples).

    Returns:
        ``uint8[H, W, 3]``.
    """
    if len(layers) > 255:
        raise ValueError(f"compose takes at most 255 layers, got {len(layers)}")
    palette = np.array([background] + [tuple(c) for _, c in layers], np.uint8)
    index = jnp.zeros(shape, jnp.uint8)
    for k, (mask, _) in enumerate(layers, start=1):
        index = jnp.where(mask, jnp.uint8(k), index)
    return jnp.asarray(palette)[index]


def rect_mask(shape: tuple[int, int], x0: Scalar, y0: Scalar, x1: Scalar, y1: Scalar) -> jax.Array:
    """The axis-aligned rectangle with corners ``(x0, y0)`` and ``(x1, y1)`` (any order)."""
    xs, ys = pixel_centers(shape)
    lo_x, hi_x = jnp.minimum(x0, x1), jnp.maximum(x0, x1)
    lo_y, hi_y = jnp.minimum(y0, y1), jnp.maximum(y0, y1)
    return (xs >= lo_x) & (xs <= hi_x) & (ys >= lo_y) & (ys <= hi_y)


def box_mask(
    shape: tuple[int, int],
    cx: Scalar,
    cy: Scalar,
    width: Scalar,
    height: Scalar,
    angle: Scalar = 0.0,
) -> jax.Array:
    """A ``width x height`` rectangle centered at ``(cx, cy)``, rotated by ``angle``.

    ``angle`` is in radians, clockwise on screen (the pixel frame has ``y`` down); at 0
    the ``width`` side is horizontal.
    """
    xs, ys = pixel_centers(shape)
    dx, dy = xs - cx, ys - cy
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    along = dx * cos + dy * sin
    across = -dx * sin + dy * cos
    return (jnp.abs(along) <= width / 2) & (jnp.abs(across) <= height / 2)


def circle_mask(shape: tuple[int, int], cx: Scalar, cy: Scalar, radius: Scalar) -> jax.Array:
    """The filled disc of ``radius`` around ``(cx, cy)``."""
    xs, ys = pixel_centers(shape)
    return (xs - cx) ** 2 + (ys - cy) ** 2 <= radius**2


def ring_mask(
    shape: tuple[int, int], cx: Scalar, cy: Scalar, radius: Scalar, thickness: Scalar
) -> jax.Array:
    """The annulus around ``(cx, cy)`` between ``radius - thickness`` and ``radius``."""
    xs, ys = pixel_centers(shape)
    d2 = (xs - cx) ** 2 + (ys - cy) ** 2
    inner = jnp.maximum(radius - thickness, 0.0)
    return (d2 <= radius**2) & (d2 >= inner**2)


def segment_mask(
    shape: tuple[int, int], x0: Scalar, y0: Scalar, x1: Scalar, y1: Scalar, width: Scalar
) -> jax.Array:
    """The line segment from ``(x0, y0)`` to ``(x1, y1)`` drawn ``width`` wide, with round
    ends (a capsule: every pixel within ``width / 2`` of the segment). A zero-length
    segment is a disc."""
    xs, ys = pixel_centers(shape)
    dx, dy = x1 - x0, y1 - y0
    length2 = dx * dx + dy * dy
    t = ((xs - x0) * dx + (ys - y0) * dy) / jnp.maximum(length2, 1e-12)
    t = jnp.clip(t, 0.0, 1.0)
    ex, ey = xs - (x0 + t * dx), ys - (y0 + t * dy)
    return ex * ex + ey * ey <= (width / 2) ** 2


def triangle_mask(
    shape: tuple[int, int],
    p0: tuple[Scalar, Scalar],
    p1: tuple[Scalar, Scalar],
    p2: tuple[Scalar, Scalar],
) -> jax.Array:
    """The filled triangle with corners ``p0``, ``p1``, ``p2`` (``(x, y)`` each, any order)."""
    xs, ys = pixel_centers(shape)

    def side(a: tuple[Scalar, Scalar], b: tuple[Scalar, Scalar]) -> jax.Array:
        return (b[0] - a[0]) * (ys - a[1]) - (b[1] - a[1]) * (xs - a[0])

    s0, s1, s2 = side(p0, p1), side(p1, p2), side(p2, p0)
    return ((s0 >= 0) & (s1 >= 0) & (s2 >= 0)) | ((s0 <= 0) & (s1 <= 0) & (s2 <= 0))


def below_curve_mask(shape: tuple[int, int], curve_y: jax.Array) -> jax.Array:
    """Pixels on or below (larger ``y`` than) a curve given per column.

    Args:
        shape: ``(H, W)``.
        curve_y: ``float32[W]``, the curve's pixel ``y`` at each column's center.
    """
    _, ys = pixel_centers(shape)
    return ys >= curve_y[None, :]


def curve_mask(shape: tuple[int, int], curve_y: jax.Array, width: Scalar) -> jax.Array:
    """A curve given per column (``curve_y: float32[W]``, pixel ``y`` at each column's
    center) drawn ``width`` pixels thick, measured along the normal (so steep parts do
    not thin out)."""
    _, ys = pixel_centers(shape)
    if curve_y.shape[0] > 1:  # central differences, one-sided at the ends
        d = jnp.diff(curve_y)
        slope = jnp.concatenate([d[:1], (d[:-1] + d[1:]) / 2, d[-1:]])
    else:
        slope = jnp.zeros_like(curve_y)
    half = width / 2 * jnp.sqrt(1.0 + slope**2)
    return jnp.abs(ys - curve_y[None, :]) <= half[None, :]


def paint_circles(
    image: jax.Array,
    cx: jax.Array,
    cy: jax.Array,
    radius: Scalar | jax.Array,
    colors: jax.Array | np.ndarray,
) -> jax.Array:
    """Paints ``N`` discs at once; where they overlap, the later one (larger index) shows.

    Args:
        image: ``uint8[H, W, 3]``.
        cx, cy: ``float32[N]`` pixel centers.
        radius: a scalar or ``float32[N]``.
        colors: ``uint8[N, 3]``.

    Returns:
        ``uint8[H, W, 3]``. Memory is ``N * H * W``; meant for tens of discs.
    """
    xs, ys = pixel_centers((image.shape[0], image.shape[1]))
    cx, cy = jnp.asarray(cx, jnp.float32), jnp.asarray(cy, jnp.float32)
    n = cx.shape[0]
    r = jnp.broadcast_to(jnp.asarray(radius, jnp.float32), (n,))
    inside = (xs[None] - cx[:, None, None]) ** 2 + (ys[None] - cy[:, None, None]) ** 2 <= (
        r[:, None, None] ** 2
    )  # [N, H, W]
    top = jnp.max(jnp.where(inside, jnp.arange(n)[:, None, None], -1), axis=0)  # [H, W]
    colors = jnp.asarray(colors, jnp.uint8)
    return jnp.where((top >= 0)[..., None], colors[jnp.maximum(top, 0)], image)


def cells_image(codes: jax.Array, palette: jax.Array | np.ndarray, cell_px: int) -> jax.Array:
    """A grid of square cells, each ``cell_px`` pixels wide, colored by code.

    Args:
        codes: ``int[R, C]``, indices into ``palette``.
        palette: ``uint8[K, 3]``.
        cell_px: pixels per cell side (static).

    Returns:
        ``uint8[R * cell_px, C * cell_px, 3]``; cell ``(r, c)`` covers rows
        ``r * cell_px ..`` and columns ``c * cell_px ..``.
    """
    image = jnp.asarray(palette, jnp.uint8)[codes]  # [R, C, 3]
    return jnp.repeat(jnp.repeat(image, cell_px, axis=0), cell_px, axis=1)


@dataclasses.dataclass(frozen=True)
class Viewport:
    """Maps the world rectangle ``[x_min, x_max] x [y_min, y_max]`` (``y`` up) onto an
    ``(H, W)`` image (``y`` down): ``x_min`` is the image's left edge, ``y_max`` its top
    edge. The bounds may be traced scalars (for example read from params).

    Attributes:
        shape: ``(H, W)`` in pixels (static).
        x_min, x_max, y_min, y_max: the world rectangle shown.
    """

    shape: tuple[int, int]
    x_min: Scalar
    x_max: Scalar
    y_min: Scalar
    y_max: Scalar

    @property
    def scale_x(self) -> Scalar:
        """Pixels per world unit along ``x``."""
        return self.shape[1] / (self.x_max - self.x_min)

    @property
    def scale_y(self) -> Scalar:
        """Pixels per world unit along ``y``."""
        return self.shape[0] / (self.y_max - self.y_min)

    def to_pixel(self, x: Scalar, y: Scalar) -> tuple[jax.Array, jax.Array]:
        """The pixel coordinates ``(px, py)`` of world point ``(x, y)``:
        ``px = (x - x_min) * W / (x_max - x_min)``,
        ``py = (y_max - y) * H / (y_max - y_min)``."""
        px = (jnp.asarray(x, jnp.float32) - self.x_min) * self.scale_x
        py = (self.y_max - jnp.asarray(y, jnp.float32)) * self.scale_y
        return px, py
