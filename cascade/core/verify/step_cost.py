"""The verifier's step-cost model: the seconds of one packed verification pass, from its shape.

Speculating pays only where a drafted token costs the verifier less than it saves, and what it
costs is the hardware's business (a 9-token pass: about 1.1 one-token passes on AMX in bfloat16,
1.6 to 2 in float32 without), so it is measured. The form, linear in its parameters and fitted by
least squares on relative error (a 40 ms pass counts as much as a 400 ms one), over a pass's
``StepShape`` (rows, new tokens and cached positions, all rows together):

    t = g(tokens) + c_row (rows - 1) + c_kv cached + c_att tokens cached / rows
        + c_decode decode_cached

- ``g``: piecewise linear in the pass's new tokens (the linear layers see all rows' tokens as one
  matrix), a knot per token count profiled: CPU matmul kernels are neither flat nor linear in it
  (flat to a knee; on some CPUs 5 tokens run faster than 3), so the curve is taken as measured.
- ``c_row``: per-row work outside the matmuls (packed attention runs row by row);
  ``c_kv``: reading the cached keys and values (what one-token attention is bound by);
  ``c_att``: new tokens times the cached positions they see (exact for equal rows);
  ``c_decode``: what one-token rows' attention costs beyond that per cached position (a
  one-query kernel can be much slower: 3x a two-query one in bfloat16 on AVX-512 CPUs).
  All four are kept non-negative.

``step_profile.profile`` times real ``VerifyEngine.run`` passes and fits this model;
``observe`` refines the fit from real steps.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import torch


FORMAT_VERSION = 2
MIN_SECONDS = 1e-6
"""Floor of a prediction (a fit never promises a free pass)."""
PROFILE_WEIGHT = 0.25
"""A profiled point's weight in a refit, against a new real step's 1: the profile is the prior,
real steps decide wherever they exist."""
OUTLIER_ERROR = 0.2
"""A profiled point off the fit by less than this is never timed again."""
MIN_SCALE = 0.02
"""Floor of the typical relative residual that sets how far one real step may pull."""
_TERMS = ("row", "kv", "attention", "decode")

Point = tuple["StepShape", float]
"""A pass and its seconds."""


class StepCostError(ValueError):
    """No cost model can be built from what was given (no measurements, a damaged file)."""


@dataclass(frozen=True)
class StepShape:
    """What one pass holds, the inputs of the cost model."""

    num_rows: int
    """Sessions in the pass (one row each)."""
    num_tokens: int
    """New tokens fed, all rows together (a verification row feeds its draft plus one)."""
    num_cached: int = 0
    """Cached positions attended to, all rows together."""
    num_decode_cached: int | None = None
    """Cached positions of the rows that feed one token (plain decoding), whose attention runs
    other kernels than a block's; None: all of them when every row feeds one token, else 0."""

    def __post_init__(self) -> None:
        if self.num_decode_cached is None:
            is_decode = self.num_tokens == self.num_rows
            object.__setattr__(self, "num_decode_cached", self.num_cached if is_decode else 0)
        for name, low in (("num_rows", 1), ("num_tokens", self.num_rows), ("num_cached", 0),
                          ("num_decode_cached", 0)):
            if getattr(self, name) < low:  # every row feeds at least one token
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.num_decode_cached > self.num_cached:
            raise ValueError(f"num_decode_cached must be <= num_cached ({self.num_cached}), "
                             f"got {self.num_decode_cached}")


def _knot_weights(knots: list[int], num_tokens: int) -> list[float]:
    """g(num_tokens) as a combination of g's knot values: linear interpolation; past the last
    knot, the slope of a line through the upper half of the knots (one segment's slope is noise
    where kernels step)."""
    if len(knots) == 1:
        return [1.0]
    weights = [0.0] * len(knots)
    if num_tokens > knots[-1]:
        tail = [j for j, k in enumerate(knots) if 2 * k >= knots[-1]]
        tail = tail if len(tail) > 1 else [len(knots) - 2, len(knots) - 1]
        mean = sum(knots[j] for j in tail) / len(tail)
        spread = sum((knots[j] - mean) ** 2 for j in tail)
        weights[-1] = 1.0
        for j in tail:
            weights[j] += (num_tokens - knots[-1]) * (knots[j] - mean) / spread
        return weights
    i = min(max(bisect.bisect_right(knots, num_tokens) - 1, 0), len(knots) - 2)
    u = (num_tokens - knots[i]) / (knots[i + 1] - knots[i])
    weights[i], weights[i + 1] = 1.0 - u, u
    return weights


def _features(knots: list[int], shape: StepShape) -> list[float]:
    """The shape's row of the design matrix: g's knot weights, then the three linear terms."""
    attention = shape.num_tokens * shape.num_cached / shape.num_rows
    return (_knot_weights(knots, shape.num_tokens) + [
        float(shape.num_rows - 1), float(shape.num_cached), attention,
        float(shape.num_decode_cached)])


def _varied_terms(points: list[Point]) -> list[int]:
    """The linear terms the points vary apart from the knots: rows when some token count was
    timed with two row counts, cached ones when two cached lengths per row were (decode ones
    when, besides, rows of one token and of more were)."""
    rows: dict[int, set[int]] = {}
    for s, _ in points:
        rows.setdefault(s.num_tokens, set()).add(s.num_rows)
    varied = [0] if any(len(r) > 1 for r in rows.values()) else []
    if len({s.num_cached / s.num_rows for s, _ in points}) > 1:
        varied += [1, 2]
        if {bool(s.num_decode_cached) for s, _ in points if s.num_cached} == {True, False}:
            varied.append(3)
    return varied


def _fit(knots: list[int], points: list[Point], weights: list[float] | None = None
         ) -> list[float]:
    """Weighted least squares on relative error. A term the points do not vary stays 0, and one
    that comes out negative is dropped and the rest refitted (non-negative least squares)."""
    x = torch.tensor([_features(knots, s) for s, _ in points], dtype=torch.float64)
    y = torch.tensor([t for _, t in points], dtype=torch.float64)
    w = torch.tensor(weights or [1.0] * len(points), dtype=torch.float64).sqrt()
    x = x * (w / y)[:, None]  # relative error: every row's target is its sqrt(weight)
    scale = x.abs().amax(0).clamp_min(1e-300)  # columns of similar size for the solver
    free = list(range(len(knots))) + [len(knots) + j for j in _varied_terms(points)]
    while True:
        coef = torch.zeros(x.shape[1], dtype=torch.float64)
        solution = torch.linalg.lstsq(x[:, free] / scale[free], w[:, None], driver="gelsd")
        coef[free] = solution.solution[:, 0] / scale[free]
        negative = [j for j in free if j >= len(knots) and coef[j] < 0]
        if not negative:
            return coef.tolist()
        free.remove(min(negative, key=lambda j: coef[j]))


class StepCostModel:
    """Predicted seconds of a verification pass (form in the module docstring).

    ``points`` are the profile's measurements, in every refit at ``PROFILE_WEIGHT``; a real step
    weighs 1 when new, halving every ``half_life`` steps. A token count real traffic never hits
    keeps its profiled cost; the ones it hits follow the traffic within a few dozen steps.
    """

    def __init__(self, knots: list[int], coef: list[float], points: list[Point],
                 meta: dict | None = None, *, half_life: float = 16.0,
                 refit_every: int = 8) -> None:
        if not knots or len(coef) != len(knots) + len(_TERMS):
            raise StepCostError(f"{len(coef)} coefficients for {len(knots)} knots")
        self.knots, self.coef, self.points = list(knots), list(coef), list(points)
        self.meta = dict(meta or {})
        self.half_life, self.refit_every = half_life, refit_every
        self.recent: deque[Point] = deque(maxlen=int(8 * half_life) + 1)
        """The latest real steps (clipped), newest last; older ones would weigh under 1/256."""
        self.retimed: list[Point] = []
        """Profiled points the first fit disagreed with, as first timed (not saved)."""
        self._scale, self._unfitted = 0.05, 0  # typical relative residual of recent steps

    @classmethod
    def fit(cls, points: list[Point], meta: dict | None = None, **kwargs) -> StepCostModel:
        """Knots at the token counts measured, coefficients by ``_fit``."""
        points = [(s, float(t)) for s, t in points if t > 0]
        if not points:
            raise StepCostError("no positive measurements to fit a step-cost model to")
        knots = sorted({s.num_tokens for s, _ in points})
        return cls(knots, _fit(knots, points), points, meta, **kwargs)

    def disagreeing(self) -> list[int]:
        """Indices of the points off the fit by more than ``OUTLIER_ERROR`` and four times the
        median error: timed while another process had the cores, or a real effect the form
        misses (timing them again tells which)."""
        errors = [abs(self.predict(s) / t - 1) for s, t in self.points]
        limit = max(OUTLIER_ERROR, 4 * statistics.median(errors))
        return [i for i, e in enumerate(errors) if e > limit]

    @property
    def terms(self) -> dict[str, float]:
        """Seconds per extra row, per cached position, per (new token x cached position), and
        per cached position of a one-token row on top."""
        return dict(zip(_TERMS, self.coef[len(self.knots):]))

    def predict(self, shape: StepShape) -> float:
        value = sum(c * f for c, f in zip(self.coef, _features(self.knots, shape)))
        return max(value, MIN_SECONDS)

    def marginal(self, shape: StepShape, extra_tokens: int) -> float:
        """Seconds that ``extra_tokens`` more drafted tokens add to the pass. They go to rows
        that already draft, or, when every row decodes, to every row (none decodes after).
        Negative where the hardware runs the longer matrix faster."""
        is_decode = shape.num_tokens == shape.num_rows
        bigger = replace(shape, num_tokens=shape.num_tokens + extra_tokens,
                         num_decode_cached=None if is_decode else shape.num_decode_cached)
        return self.predict(bigger) - self.predict(shape)

    def observe(self, shape: StepShape, seconds: float) -> None:
        """Refine from a real step. Its residual is clipped at three times the typical recent
        one: a lone outlier (a GC pause) moves the fit little, a lasting change widens the
        clip within a few steps."""
        if seconds <= 0:
            return
        if shape.num_tokens > self.knots[-1]:
            self._add_knot(1 << (shape.num_tokens - 1).bit_length())
        predicted = self.predict(shape)
        bound = 3 * self._scale
        residual = min(max(seconds / predicted - 1, -min(bound, 0.9)), bound)
        self._scale = max(MIN_SCALE, 0.9 * self._scale + 0.1 * abs(residual))
        self.recent.append((shape, predicted * (1 + residual)))
        self._unfitted += 1
        if self._unfitted >= self.refit_every:
            ages = range(len(self.recent) - 1, -1, -1)
            weights = [0.5 ** (age / self.half_life) for age in ages]
            self.coef = _fit(self.knots, self.points + list(self.recent),
                             [PROFILE_WEIGHT] * len(self.points) + weights)
            self._unfitted = 0

    def _add_knot(self, num_tokens: int) -> None:
        """A knot past the profiled ones (a long prefill), anchored at the extrapolated cost
        (predictions up to it do not change) until real steps there say otherwise."""
        anchor = StepShape(1, num_tokens)
        value = self.predict(anchor)
        self.coef.insert(len(self.knots), value)
        self.knots.append(num_tokens)
        self.points.append((anchor, value))

    def to_json(self) -> str:
        points = [[s.num_rows, s.num_tokens, s.num_cached, s.num_decode_cached, t]
                  for s, t in self.points]
        return json.dumps({"version": FORMAT_VERSION, "meta": self.meta, "knots": self.knots,
                           "coef": self.coef, "points": points}, indent=1)

    @classmethod
    def from_json(cls, text: str, **kwargs) -> StepCostModel:
        try:
            data = json.loads(text)
            if data.get("version") != FORMAT_VERSION:
                raise StepCostError(f"format {data.get('version')!r}, expected {FORMAT_VERSION}")
            points = [(StepShape(*map(int, p[:4])), float(p[4])) for p in data["points"]]
            return cls([int(k) for k in data["knots"]], [float(c) for c in data["coef"]],
                       points, data.get("meta"), **kwargs)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # JSON errors included
            raise StepCostError(f"not a step-cost model: {exc}") from exc

    def save(self, path: Path) -> None:
        """Written whole or not at all (a reader never sees half a file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(self.to_json())
        os.replace(partial, path)
