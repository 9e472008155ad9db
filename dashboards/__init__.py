"""The web dashboard: figure builders (data first, figure second), templates and static files.

plotly.js is served from the installed ``plotly`` package, so the pages work offline. The number
formats used in every table live here, as Jinja filters: ``usd``, ``hours``, ``sig3``,
``memory``, ``percent``, ``when``; ``formatted`` applies the one a metric names.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import quote

import jinja2
import plotly

import sweeper
from sweeper.cost import hours_figure, money
from sweeper.store.models import NONE_COMPLETED

TEMPLATES_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"
MISSING = "—"
# The app serves STATIC_DIR at /static. Versions in the URLs let browsers cache for long and
# still fetch a new file after an upgrade.
ASSET_URLS = {
    "plotly_js": f"/static/plotly.min.js?v={plotly.__version__}",
    "style_css": f"/static/style.css?v={sweeper.__version__}",
    "study_js": f"/static/study.js?v={sweeper.__version__}",
    "docs_js": f"/static/docs.js?v={sweeper.__version__}",
}


def plotly_js_path() -> Path:
    """The minified plotly.js bundled in the ``plotly`` Python package."""
    path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    if not path.is_file():
        raise FileNotFoundError(
            f"plotly.js not found at {path}; reinstall the 'plotly' package (pip install plotly)"
        )
    return path


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def usd(value: float | None) -> str:
    """Dollars with cents; below $0.10 two significant figures (``sweeper.cost.money``).

    >>> usd(1234.567), usd(0.0013272)
    ('$1,234.57', '$0.0013')
    """
    return money(value) if _is_number(value) else MISSING


def hours(value: float | None) -> str:
    """Hours with one decimal; below 1 h two significant figures (the unit is in the column
    header).

    >>> hours(5.04), hours(0.013271)
    ('5.0', '0.013')
    """
    return hours_figure(value) if _is_number(value) else MISSING


def sig3(value: float | None) -> str:
    """Three significant digits, never in exponent notation.

    >>> [sig3(v) for v in (1234.5, 12.345, 0.012345, 9.996, 0)]
    ['1,230', '12.3', '0.0123', '10.0', '0']
    """
    if not _is_number(value):
        return MISSING
    rounded = float(f"{value:.3g}")
    if rounded == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:,.{decimals}f}"


def memory(value: int | None) -> str:
    """Bytes in binary units.

    >>> memory(3 * 2**30), memory(5 * 2**20)
    ('3.0 GiB', '5 MiB')
    """
    if not _is_number(value):
        return MISSING
    if value >= 2**30:
        return f"{value / 2**30:,.1f} GiB"
    return f"{value / 2**20:,.0f} MiB"


def percent(value: float | None) -> str:
    """A share in [0, 1] as a percentage.

    >>> percent(0.123)
    '12.3%'
    """
    return f"{value * 100:.1f}%" if _is_number(value) else MISSING


def text(value: object) -> str:
    """A value as it is, or the missing mark.

    >>> text("NVIDIA H100 80GB HBM3"), text(None)
    ('NVIDIA H100 80GB HBM3', '—')
    """
    return MISSING if value is None else str(value)


# Formats by name, as a Metric names its own (sweeper.measurement.Metric.format).
FORMATS = {
    "usd": usd,
    "hours": hours,
    "sig3": sig3,
    "memory": memory,
    "percent": percent,
    "text": text,
}


def formatted(value: Any, format_name: str) -> str:
    """``value`` in the format named ``format_name`` (a key of FORMATS).

    >>> formatted(0.123, "percent")
    '12.3%'
    """
    return FORMATS[format_name](value)


def when(value: datetime | None) -> str:
    """A timestamp in UTC to the minute; naive values (SQLite) are already UTC."""
    if value is None:
        return MISSING
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def path_segment(value: object) -> str:
    """A value quoted for one URL path segment (``/`` included).

    >>> path_segment("a b/c")
    'a%20b%2Fc'
    """
    return quote(str(value), safe="")


def knob_value(value: object) -> str:
    """A knob's value as a reader wants it: "—" where the knob does not apply (None), yes/no
    for a switch; never Python's None/True or JSON's null."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def template_environment() -> jinja2.Environment:
    """Jinja for our pages: autoescape on for every template, undefined names are errors."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        usd=usd,
        hours=hours,
        sig3=sig3,
        memory=memory,
        percent=percent,
        formatted=formatted,
        when=when,
        path_segment=path_segment,
        knob=knob_value,
    )
    env.globals["assets"] = ASSET_URLS
    env.globals["none_completed"] = NONE_COMPLETED
    return env
