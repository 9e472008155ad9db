"""Figures of a study: a function returns plain rows, another builds the Plotly figure from them.

Tests check the rows; the figure functions only lay them out. Figures are returned as JSON-able
dicts (``fig.to_plotly_json()``) that the page embeds and plotly.js draws, e.g.::

    rows = history_rows(store.list_trials("cpu-demo"))
    figure = history_figure(rows)      # {"data": [...], "layout": {...}}

Plotly renders a subset of HTML in trace names and hover text, so every user string (config
values, group names) goes through ``plain_text`` first.
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import plotly.graph_objects as go

from sweeper.cost import hours_figure, money
from sweeper.knob_values import as_ran

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#000000",
)
INK = "#1f2933"
MUTED = "#7b8794"
GRID = "#e4e7eb"
NO_VALUE = "(unset)"


class TrialLike(Protocol):
    """What the figures read from a trial: a ``TrialRow`` or an API ``TrialSummary``."""

    @property
    def number(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def config(self) -> Mapping[str, Any]: ...
    @property
    def samples_per_s(self) -> float | None: ...
    @property
    def tokens_per_s(self) -> float | None: ...
    @property
    def hours_per_run(self) -> float | None: ...
    @property
    def cost_per_run_usd(self) -> float | None: ...
    @property
    def failure_kind(self) -> str | None: ...


def plain_text(value: object) -> str:
    """Text that plotly shows literally: its pseudo-HTML tags and entities are escaped."""
    if isinstance(value, str | int | float | bool | None):
        return _plain_scalar(value)
    return html.escape(str(value), quote=False)


@functools.lru_cache(maxsize=4096, typed=True)  # typed: True and 1 are different knob values
def _plain_scalar(value: str | float | bool | None) -> str:
    # Config values repeat across thousands of trials' hover texts.
    return html.escape(str(value), quote=False)


def knob_label(name: str) -> str:
    """A knob's short label ("batch size", "grad. accumulation"), as the tables use."""
    from sweeper.knobs import KNOBS

    return next((k.label for k in KNOBS if k.name == name), name)


def value_text(value: object) -> str:
    """A knob value on an axis: "—" where the knob does not apply, yes/no for a switch."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return plain_text(value)


def config_text(config: Mapping[str, Any]) -> str:
    """A config as hover text, one ``knob = value`` per line, escaped for plotly."""
    return "<br>".join(f"{plain_text(key)} = {plain_text(value)}" for key, value in config.items())


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _ran(trial: TrialLike) -> dict[str, Any]:
    """The trial's config as it ran: a script's own values in place (``as_ran``); a row
    without ``own_values`` (TrialLike does not require it) is its config."""
    return as_ran(trial.config, getattr(trial, "own_values", None))


def _by_number(trials: Iterable[TrialLike]) -> list[TrialLike]:
    return sorted(trials, key=lambda trial: trial.number)


# ------------------------------------------------------------------ optimization history


def history_rows(trials: Iterable[TrialLike]) -> list[dict[str, Any]]:
    """$/run of each completed trial in trial order, with the best (lowest) $/run so far.

    Failed, pruned and running trials have no price and are left out.

    >>> history_rows([])
    []
    """
    rows: list[dict[str, Any]] = []
    best_so_far = math.inf
    for trial in _by_number(trials):
        if trial.state != "complete" or not _finite(trial.cost_per_run_usd):
            continue
        cost = float(trial.cost_per_run_usd)  # type: ignore[arg-type]
        is_new_best = cost < best_so_far
        best_so_far = min(best_so_far, cost)
        rows.append(
            {
                "number": trial.number,
                "cost_per_run_usd": cost,
                "hours_per_run": trial.hours_per_run,
                "best_so_far_usd": best_so_far,
                "is_new_best": is_new_best,
                "config": _ran(trial),
            }
        )
    return rows


def history_figure(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """$/run per completed trial (markers) and the best-so-far line (a step)."""
    numbers = [row["number"] for row in rows]
    usd = _usd_format(row["cost_per_run_usd"] for row in rows)
    trials_trace = _scatter(
        name="trial $/run",
        x=numbers,
        y=[row["cost_per_run_usd"] for row in rows],
        mode="markers",
        marker={"color": PALETTE[0], "size": 9, "opacity": 0.8},
        customdata=[
            [_hours_text(row["hours_per_run"]), config_text(row["config"])] for row in rows
        ],
        hovertemplate=(
            "trial %{x}<br>$%{y:" + usd + "} per run, %{customdata[0]}<br><br>%{customdata[1]}"
            "<extra></extra>"
        ),
    )
    best_trace = _scatter(
        name="best so far",
        x=numbers,
        y=[row["best_so_far_usd"] for row in rows],
        mode="lines",
        line={"color": PALETTE[5], "width": 2, "shape": "hv"},
        hovertemplate="best so far after trial %{x}: $%{y:" + usd + "}<extra></extra>",
    )
    figure = go.Figure(layout=_layout())
    figure.update_xaxes(title_text="trial number", rangemode="nonnegative")
    figure.update_yaxes(title_text="$ per run", tickprefix="$", rangemode="tozero")
    if not rows:
        _add_empty_note(figure, "no completed trial yet")
    return _figure([trials_trace, best_trace], figure, cliponaxis=False)


def _hours_text(hours: float | None) -> str:
    """'0.013 h per run' (``cost.hours_figure``: a short job's hours are not '0.0')."""
    if hours is None or not math.isfinite(hours):
        return "hours unknown"
    return f"{hours_figure(hours)} h per run"


def _usd_format(costs: Iterable[float]) -> str:
    """The d3 format of a hover's $ figure: cents, or, where the cheapest is below $0.10,
    enough decimals for its two significant digits, as ``cost.money`` writes it (a sub-cent
    run read '$0.00' for every trial).

    >>> _usd_format([12.5, 0.31]), _usd_format([0.0013, 0.2]), _usd_format([])
    (',.2f', ',.4~f', ',.2f')
    """
    return _two_figures(costs, decimals=2, below=0.1)


def _hours_format(hours: Iterable[float]) -> str:
    """The d3 format of a hover's hours, as ``cost.hours_figure`` writes them: one decimal,
    or two significant digits for a short job (48 s read '0.0 h').

    >>> _hours_format([38.0, 2.5]), _hours_format([0.013, 4.0])
    (',.1f', ',.3~f')
    """
    return _two_figures(hours, decimals=1, below=0.95)


def _two_figures(values: Iterable[float], *, decimals: int, below: float) -> str:
    """``decimals`` fixed decimals, or, where the least positive value is below ``below``,
    as many as its two significant digits need (trailing zeros trimmed)."""
    least = min((v for v in values if _finite(v) and v > 0), default=below)
    if least >= below:
        return f",.{decimals}f"
    return f",.{max(decimals, 1 - math.floor(math.log10(least)))}~f"


# ------------------------------------------------------------------ throughput per trial


def throughput_rows(
    trials: Iterable[TrialLike], *, color_by: str = "attn_implementation"
) -> list[dict[str, Any]]:
    """Samples/s of each finished trial, grouped by one config knob.

    Completed trials carry their throughput; failed and pruned trials are kept with
    ``samples_per_s=None`` so the figure can show which groups fail. Running trials are left out.
    """
    rows: list[dict[str, Any]] = []
    for trial in _by_number(trials):
        if trial.state == "running":
            continue
        completed = trial.state == "complete" and _finite(trial.samples_per_s)
        if trial.state == "complete" and not completed:
            continue
        rows.append(
            {
                "number": trial.number,
                "state": trial.state,
                "group": str(_ran(trial).get(color_by, NO_VALUE)),
                "samples_per_s": trial.samples_per_s if completed else None,
                "tokens_per_s": trial.tokens_per_s if completed else None,
                "failure_kind": trial.failure_kind,
                "config": _ran(trial),
            }
        )
    return rows


def throughput_figure(
    rows: list[dict[str, Any]], *, color_by: str = "attn_implementation"
) -> dict[str, Any]:
    """Samples/s per trial, one colour per group; failed trials are crosses on the axis."""
    groups = sorted({row["group"] for row in rows})
    traces = []
    for index, group in enumerate(groups):
        color = PALETTE[index % len(PALETTE)]
        label = plain_text(group)
        completed = [r for r in rows if r["group"] == group and r["samples_per_s"] is not None]
        failed = [r for r in rows if r["group"] == group and r["samples_per_s"] is None]
        if completed:
            traces.append(
                _scatter(
                    name=label,
                    legendgroup=label,
                    x=[row["number"] for row in completed],
                    y=[row["samples_per_s"] for row in completed],
                    mode="markers",
                    marker={"color": color, "size": 9, "opacity": 0.85},
                    customdata=[
                        [_tokens_text(row["tokens_per_s"]), config_text(row["config"])]
                        for row in completed
                    ],
                    hovertemplate=(
                        "trial %{x}<br>%{y:,.3r} samples/s, %{customdata[0]}<br><br>"
                        "%{customdata[1]}<extra></extra>"
                    ),
                )
            )
        if failed:
            traces.append(
                _scatter(
                    name=f"{label} (failed)",
                    legendgroup=label,
                    # A group that only failed still needs its legend entry.
                    showlegend=not completed,
                    x=[row["number"] for row in failed],
                    y=[0.0 for _ in failed],
                    mode="markers",
                    marker={"color": color, "size": 10, "symbol": "x-thin", "line": {"width": 2}},
                    customdata=[
                        [
                            plain_text(row["failure_kind"] or row["state"]),
                            config_text(row["config"]),
                        ]
                        for row in failed
                    ],
                    hovertemplate=(
                        "trial %{x}: %{customdata[0]}<br><br>%{customdata[1]}<extra></extra>"
                    ),
                )
            )
    figure = go.Figure(layout=_layout())
    figure.update_layout(legend_title_text=plain_text(knob_label(color_by)))
    figure.update_xaxes(title_text="trial number", rangemode="nonnegative")
    figure.update_yaxes(title_text="samples/s (× = failed)", rangemode="tozero")
    if not any(row["samples_per_s"] is not None for row in rows):
        _add_empty_note(figure, "no completed trial yet")
    # Markers on the axes (failed trials at 0, trial 0) would otherwise be cut in half.
    return _figure(traces, figure, cliponaxis=False)


def _tokens_text(tokens_per_s: float | None) -> str:
    return f"{tokens_per_s:,.0f} tokens/s" if _finite(tokens_per_s) else "tokens/s unknown"


# ------------------------------------------------------------------ shared layout


def _scatter(**props: Any) -> dict[str, Any]:
    """A scatter trace as a plain dict (see ``_figure``)."""
    return {"type": "scatter", **props}


def _figure(traces: list[dict[str, Any]], frame: go.Figure, **every_trace: Any) -> dict[str, Any]:
    """Plotly JSON of ``frame``'s layout (built and validated by plotly) with ``traces`` as
    plain dicts, each given ``every_trace``'s properties.

    Large traces skip plotly's graph objects: validating and deep-copying 10,000-point arrays
    took seconds per study, for traces whose few property names these functions fix.
    """
    out = frame.to_plotly_json()
    out["data"] = [{**trace, **every_trace} for trace in traces]
    return out


def _layout() -> go.Layout:
    return go.Layout(
        template="plotly_white",
        font={"family": "system-ui, -apple-system, 'Segoe UI', sans-serif", "color": INK},
        margin={"l": 64, "r": 16, "t": 32, "b": 48},
        height=340,
        hovermode="closest",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        # Plotly.react keeps the user's zoom and legend toggles across live updates.
        uirevision="study",
        xaxis={"gridcolor": GRID, "zeroline": False},
        yaxis={"gridcolor": GRID, "zeroline": False},
    )


def _add_empty_note(figure: go.Figure, text: str) -> None:
    figure.add_annotation(
        text=plain_text(text),
        xref="paper",
        yref="paper",
        x=0.5,
        y=0.5,
        showarrow=False,
        font={"color": MUTED, "size": 14},
    )


# ------------------------------------------------------------------ knobs: parallel coordinates


def _varying_knobs(rows: list[dict[str, Any]]) -> list[str]:
    """Knobs that take more than one value among ``rows`` (first-seen order)."""
    values: dict[str, set[str]] = {}
    for row in rows:
        for knob, value in row["config"].items():
            values.setdefault(knob, set()).add(repr(value))
    return [knob for knob, seen in values.items() if len(seen) > 1]


def _priced(trials: Iterable[TrialLike]) -> list[dict[str, Any]]:
    return [
        {"number": t.number, "config": _ran(t), "cost_per_run_usd": t.cost_per_run_usd}
        for t in _by_number(trials)
        if t.state == "complete" and _finite(t.cost_per_run_usd)
    ]


def parallel_rows(trials: Iterable[TrialLike]) -> dict[str, Any]:
    """Completed trials as one line each across the knobs that vary, ending at $/run.

    >>> parallel_rows([])
    {'knobs': [], 'rows': []}
    """
    rows = _priced(trials)
    return {"knobs": _varying_knobs(rows), "rows": rows}


def _axis_values(values: list[Any]) -> tuple[list[float], list[float], list[str]]:
    """Positions, tick positions and tick labels for one knob's values: numbers keep their
    order, anything else (and None) is spaced evenly in sorted order."""
    distinct = sorted({repr(v): v for v in values}.values(), key=lambda v: (str(type(v)), str(v)))
    numeric = all(_is_plain_number(v) for v in distinct)
    if numeric:
        ordered = sorted(distinct)
        index = {repr(v): float(v) for v in ordered}
        return (
            [index[repr(v)] for v in values],
            [float(v) for v in ordered],
            [plain_text(v) for v in ordered],
        )
    index = {repr(v): float(i) for i, v in enumerate(distinct)}
    return (
        [index[repr(v)] for v in values],
        list(index.values()),
        [value_text(v) for v in distinct],
    )


def _tick_text(text: str, most: int = 10) -> str:
    """A parallel-coordinates tick label that fits between two axes.

    >>> _tick_text("adamw_torch_fused"), _tick_text("sdpa")
    ('adamw_tor…', 'sdpa')
    """
    return text if len(text) <= most else text[: most - 1] + "…"


def _is_plain_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# Viridis, reversed: the cheapest bin is the brightest.
_COST_BINS = ("#fde725", "#7ad151", "#22a884", "#2a788e", "#414487", "#440154")


def parallel_figure(data: dict[str, Any]) -> dict[str, Any]:
    """Parallel coordinates drawn in SVG (plotly's parcoords needs WebGL, which many remote
    and GPU-less browsers refuse): one vertical axis per varying knob, then $/run; one line per
    completed trial, coloured by its $/run sextile, the cheapest drawn thick."""
    rows, knobs = data["rows"], data["knobs"]
    axes = [*knobs, "$ per run"]
    positions: list[list[float]] = [[] for _ in rows]
    annotations: list[dict[str, Any]] = []
    for x, axis in enumerate(axes):
        if axis == "$ per run":
            costs = [row["cost_per_run_usd"] for row in rows]
            low, high = (min(costs), max(costs)) if costs else (0.0, 1.0)
            span = (high - low) or 1.0
            values = [(c - low) / span for c in costs]
            ticks = [(0.0, money(low)), (1.0, money(high))] if costs else []
        else:
            raw, tickvals, ticktext = _axis_values([row["config"].get(axis) for row in rows])
            low, high = (min(tickvals), max(tickvals)) if tickvals else (0.0, 1.0)
            span = (high - low) or 1.0
            values = [(v - low) / span for v in raw]
            ticks = [((t - low) / span, text) for t, text in zip(tickvals, ticktext, strict=True)]
        for trial_positions, value in zip(positions, values, strict=True):
            trial_positions.append(value)
        title = axis if axis == "$ per run" else plain_text(knob_label(axis))
        # many axes: every other title one line higher, so neighbours never overlap
        lift = 0.07 if len(axes) > 6 and x % 2 else 0.0
        annotations.append(
            {"x": x, "y": 1.06 + lift, "text": title, "showarrow": False, "yanchor": "bottom"}
        )
        annotations += [
            {
                "x": x,
                "y": y,
                # a long value (adamw_torch_fused) ran over the axis to its left: cut, whole
                # on hover
                "text": _tick_text(text),
                "hovertext": text,
                "showarrow": False,
                "xanchor": "right",
                "xshift": -4,
                "font": {"size": 11, "color": MUTED},
                "bgcolor": "rgba(255, 255, 255, 0.8)",
            }
            for y, text in ticks
        ]
    order = sorted(range(len(rows)), key=lambda i: rows[i]["cost_per_run_usd"])
    traces = []
    for b, color in enumerate(_COST_BINS):
        members = order[b * len(order) // len(_COST_BINS) : (b + 1) * len(order) // len(_COST_BINS)]
        if not members:
            continue
        xs: list[float | None] = []
        ys: list[float | None] = []
        for i in members:
            xs += [*range(len(axes)), None]
            ys += [*positions[i], None]
        last = rows[members[-1]]
        traces.append(
            _scatter(
                # one "$" per label: plotly reads text with two as LaTeX
                name=f"up to {money(last['cost_per_run_usd'])}",
                x=xs,
                y=ys,
                mode="lines",
                line={"color": color, "width": 1.5},
                opacity=0.7,
                hoverinfo="skip",
            )
        )
    if rows:
        cheapest = order[0]
        traces.append(
            _scatter(
                name=f"cheapest (trial {rows[cheapest]['number']})",
                x=list(range(len(axes))),
                y=positions[cheapest],
                mode="lines+markers",
                line={"color": PALETTE[5], "width": 4},
                customdata=[config_text(rows[cheapest]["config"])] * len(axes),
                hovertemplate="%{customdata}<extra></extra>",
            )
        )
    figure = go.Figure(layout=_layout())
    figure.update_layout(
        annotations=annotations,
        height=380,
        margin={"l": 72, "r": 16, "t": 64, "b": 24},
        legend={"title": {"text": "$ per run"}, "y": -0.05, "yanchor": "top"},
        hovermode="closest",
    )
    figure.update_xaxes(
        range=[-0.6, len(axes) - 0.8],
        showticklabels=False,
        showgrid=True,
        gridcolor=INK,
        tickvals=list(range(len(axes))),
        zeroline=False,
    )
    top = 1.2 if len(axes) > 6 else 1.12  # room for the staggered titles
    figure.update_yaxes(range=[-0.05, top], showticklabels=False, showgrid=False)
    if not rows:
        _add_empty_note(figure, "no completed trial yet")
    return _figure(traces, figure)


# ------------------------------------------------------------------ knobs: one slice per knob


# Slice panels draw at most this many trials per knob value: 10,000 SVG markers in each of
# ten panels took the browser seconds, and a column of thousands of dots reads no better.
SLICE_POINTS_PER_VALUE = 200


def slice_rows(
    trials: Iterable[TrialLike], *, per_value: int = SLICE_POINTS_PER_VALUE
) -> dict[str, Any]:
    """For each knob that varies, the (value, $/run) of completed trials, in trial order.

    A value with more than ``per_value`` trials keeps ``per_value`` of them spread evenly over
    its $/run ranks (its cheapest and dearest always); ``shown``/``total`` count them.
    """
    rows = _priced(trials)
    knobs = []
    for knob in _varying_knobs(rows):
        by_value: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_value.setdefault(repr(row["config"].get(knob)), []).append(row)
        kept = [row for group in by_value.values() for row in _spread(group, per_value)]
        kept.sort(key=lambda row: row["number"])
        knobs.append(
            {
                "knob": knob,
                "points": [
                    {
                        "value": row["config"].get(knob),
                        "cost_per_run_usd": row["cost_per_run_usd"],
                        "number": row["number"],
                    }
                    for row in kept
                ],
                "shown": len(kept),
                "total": len(rows),
            }
        )
    return {"knobs": knobs, "per_value": per_value}


def _spread(rows: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` of ``rows`` at evenly spaced $/run ranks, the cheapest and dearest included.

    >>> [r["cost_per_run_usd"] for r in _spread([{"cost_per_run_usd": c} for c in range(9)], 3)]
    [0, 4, 8]
    """
    if len(rows) <= count:
        return rows
    ranked = sorted(rows, key=lambda row: row["cost_per_run_usd"])
    if count < 2:
        return ranked[:count]
    return [ranked[round(i * (len(ranked) - 1) / (count - 1))] for i in range(count)]


def slice_figure(data: dict[str, Any]) -> dict[str, Any]:
    """$/run against each knob's value, one panel per knob (categorical x axes)."""
    from plotly.subplots import make_subplots

    knobs = data["knobs"]
    columns = min(4, max(1, len(knobs)))
    rows = max(1, -(-len(knobs) // columns))
    figure = make_subplots(
        rows=rows,
        cols=columns,
        shared_yaxes=True,
        horizontal_spacing=0.04,
        vertical_spacing=0.18 if rows > 1 else 0.0,
        subplot_titles=[plain_text(knob_label(k["knob"])) for k in knobs] or None,
        figure=go.Figure(layout=_layout()),
    )
    traces = []
    axes_layout: dict[str, Any] = {}  # one update_layout: per-axis updates took ~0.5 s
    for index, knob in enumerate(knobs):
        row, col = index // columns + 1, index % columns + 1
        points = knob["points"]
        labels = [value_text(p["value"]) for p in points]
        _, _, order = _axis_values([p["value"] for p in points])
        axes = figure.get_subplot(row, col)
        traces.append(
            _scatter(
                name=plain_text(knob_label(knob["knob"])),
                x=labels,
                y=[p["cost_per_run_usd"] for p in points],
                customdata=[p["number"] for p in points],
                # "xaxis2" → "x2": the trace's reference to its panel's axes
                xaxis=axes.xaxis.plotly_name.replace("axis", ""),
                yaxis=axes.yaxis.plotly_name.replace("axis", ""),
                mode="markers",
                marker={"color": PALETTE[0], "size": 8, "opacity": 0.6},
                hovertemplate="trial %{customdata}: %{x}<br>$%{y:"
                + _usd_format(p["cost_per_run_usd"] for p in points)
                + "} per run<extra></extra>",
                showlegend=False,
            )
        )
        axes_layout[axes.xaxis.plotly_name] = {
            "type": "category",
            "categoryorder": "array",
            "categoryarray": order,
        }
        if col == 1:
            axes_layout[axes.yaxis.plotly_name] = {
                "title": {"text": "$ per run"},
                "tickprefix": "$",
            }
    figure.update_layout(
        axes_layout, height=40 + 260 * rows, margin={"l": 64, "r": 16, "t": 40, "b": 40}
    )
    if any(k["shown"] < k["total"] for k in knobs):
        figure.update_layout(
            height=70 + 260 * rows,
            margin={"t": 70},
            title={
                "text": f"at most {data['per_value']} trials per value, spread evenly over its "
                "$/run range (its cheapest and dearest included)",
                "font": {"size": 12, "color": MUTED},
                "x": 0,
                "xanchor": "left",
            },
        )
    if not knobs:
        _add_empty_note(figure, "no knob varies among the completed trials yet")
    return _figure(traces, figure)


# ------------------------------------------------------------------ importance


def importance_figure(ranked: Sequence[Mapping[str, Any]] | None, note: str = "") -> dict[str, Any]:
    """Horizontal bars: each knob's share of the $/run variation, largest on top."""
    ordered = list(reversed(ranked or []))
    figure = go.Figure(
        data=[
            go.Bar(
                x=[r["importance"] for r in ordered],
                y=[plain_text(r["knob"]) for r in ordered],
                orientation="h",
                marker={"color": PALETTE[0]},
                hovertemplate="%{y}: %{x:.0%} of the $/run variation<extra></extra>",
            )
        ]
        if ordered
        else [],
        layout=_layout(),
    )
    figure.update_layout(height=max(200, 60 + 36 * len(ordered)), margin={"l": 160})
    figure.update_xaxes(title_text="share of $/run variation explained", tickformat=".0%")
    if not ordered:
        _add_empty_note(figure, note or "not enough completed trials yet")
    return figure.to_plotly_json()


# ------------------------------------------------------------------ failures by kind


def failure_rows(trials: Iterable[TrialLike]) -> list[dict[str, Any]]:
    """How many trials failed of each kind, most frequent first.

    >>> failure_rows([])
    []
    """
    counts: dict[str, int] = {}
    for trial in trials:
        if trial.state == "failed":
            kind = trial.failure_kind or "error"
            counts[kind] = counts.get(kind, 0) + 1
    return [
        {"kind": k, "trials": n} for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def failure_figure(rows: list[dict[str, Any]]) -> dict[str, Any]:
    figure = go.Figure(
        data=[
            go.Bar(
                x=[plain_text(r["kind"]) for r in rows],
                y=[r["trials"] for r in rows],
                marker={"color": PALETTE[5]},
                hovertemplate="%{x}: %{y} trial(s)<extra></extra>",
            )
        ]
        if rows
        else [],
        layout=_layout(),
    )
    figure.update_layout(height=260)
    # a tick per trial keeps small counts whole; at 1,000 failures it drew 1,000 gridlines
    # (2.7 s in the browser), and plotly's own ticks are whole numbers from ~10 up
    most = max((r["trials"] for r in rows), default=0)
    figure.update_yaxes(
        title_text="failed trials", rangemode="tozero", dtick=1 if most <= 10 else None
    )
    if not rows:
        _add_empty_note(figure, "no failed trial")
    return figure.to_plotly_json()


# ------------------------------------------------------------------ Pareto across hardware


def pareto_rows(
    points_by_study: Mapping[str, Sequence[Mapping[str, Any]]], front: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Every eligible (hours, $) per study (one colour per hardware) and the Pareto front."""
    return {
        "studies": [
            {"study": study, "points": list(points)} for study, points in points_by_study.items()
        ],
        "front": [dict(p) for p in front],
    }


def pareto_figure(data: dict[str, Any]) -> dict[str, Any]:
    """$/run against hours/run: each study's trials, and the front (no point is both cheaper
    and faster than a point on it)."""
    traces = []
    every = [p for entry in data["studies"] for p in entry["points"]]
    usd = _usd_format(p["cost_per_run_usd"] for p in every)
    hours = _hours_format(p["hours_per_run"] for p in every)
    for index, entry in enumerate(data["studies"]):
        points = entry["points"]
        if not points:
            continue
        label = plain_text(f"{points[0]['hardware_name']} ({entry['study']})")
        traces.append(
            _scatter(
                name=label,
                x=[p["hours_per_run"] for p in points],
                y=[p["cost_per_run_usd"] for p in points],
                customdata=[[p["trial_number"], config_text(p["config"])] for p in points],
                mode="markers",
                marker={"color": PALETTE[index % len(PALETTE)], "size": 8, "opacity": 0.55},
                hovertemplate=(
                    "trial %{customdata[0]}: %{x:" + hours + "} h, $%{y:" + usd + "}<br><br>"
                    "%{customdata[1]}"
                    "<extra>" + label + "</extra>"
                ),
            )
        )
    front = data["front"]
    if front:
        traces.append(
            _scatter(
                name="Pareto front",
                x=[p["hours_per_run"] for p in front],
                y=[p["cost_per_run_usd"] for p in front],
                mode="lines+markers",
                line={"color": INK, "width": 2, "shape": "hv"},
                marker={"color": INK, "size": 10, "symbol": "diamond-open"},
                hovertemplate="front: %{x:" + hours + "} h, $%{y:" + usd + "}<extra></extra>",
            )
        )
    figure = go.Figure(layout=_layout())
    figure.update_xaxes(title_text="hours per run", rangemode="tozero")
    figure.update_yaxes(title_text="$ per run", tickprefix="$", rangemode="tozero")
    if not traces:
        _add_empty_note(figure, "no eligible trial yet")
    return _figure(traces, figure)
