"""Helpers for the browser tests: the served test data, a real uvicorn server, chart probes.

Fixtures live in conftest.py; these are plain functions so that new tests (and new fixtures)
can call them directly, e.g.::

    page.goto(server.url(study_path(STUDY)))
    assert wait_for_chart(page, "chart-history") == 2
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import uvicorn
from fastapi import FastAPI
from playwright.sync_api import Locator, Page

from sweeper.store import Store
from tests.test_api import PLAIN_STUDY, STUDY, add_complete, add_study, config, fill

__all__ = ["PLAIN_STUDY", "STUDY"]  # re-exported: the studies tests.test_api.fill writes

LOCAL_HOST = "127.0.0.1"
HOSTILE_STUDY = "<img src=x onerror=alert(1)>"
# A knob value that reaches the trials table and the throughput chart's legend.
HOSTILE_KNOB = "<b>bold</b><img src=y onerror=alert(2)>"
LIVE_STUDY = "live demo"
ALL_STUDIES = {STUDY, PLAIN_STUDY, HOSTILE_STUDY, LIVE_STUDY}


def fill_dashboard_store(url: str) -> str:
    """tests.test_api's studies, plus a study with a hostile name and one for live updates.

    STUDY: trials 0, 1, 3 complete (eager, sdpa, sdpa), 2 failed (flex_attention), 4 running.
    HOSTILE_STUDY: trials 0 (attn_implementation = HOSTILE_KNOB) and 1 (sdpa) complete.
    LIVE_STUDY: running, trial 0 complete at $4.00/run; tests add trials to it.
    """
    fill(url)
    store = Store(url)
    try:
        add_study(store, HOSTILE_STUDY)
        add_complete(store, HOSTILE_STUDY, 0, config(HOSTILE_KNOB, 8, 1), cost=3.0, it_per_s=1.0)
        # A second group, so plotly shows the legend (it hides it for a single trace).
        add_complete(store, HOSTILE_STUDY, 1, config("sdpa", 8, 1), cost=2.0, it_per_s=1.0)
        add_study(store, LIVE_STUDY)
        add_complete(store, LIVE_STUDY, 0, config("eager", 8, 1), cost=4.0, it_per_s=1.0)
    finally:
        store.dispose()
    return url


def study_path(name: str) -> str:
    """The study page's path, with the name percent-encoded as one segment."""
    return f"/studies/{quote(name, safe='')}"


@dataclass(frozen=True, kw_only=True)
class LiveServer:
    """A running app: where to reach it and the database it serves (to change it mid-test)."""

    base_url: str
    storage_url: str

    def url(self, path: str = "/") -> str:
        return f"{self.base_url}{path}"


@contextmanager
def running_server(app: FastAPI, *, start_timeout_s: float = 15.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a background thread; yields its base URL.

    The socket is bound here (port 0) so the URL is known before the server starts and no
    other process can take the port in between.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOCAL_HOST, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=LOCAL_HOST,
            port=port,
            log_level="warning",
            ws="none",  # the pages poll over HTTP; no websocket library to import or warn
            # Without a bound, shutdown waits for every keep-alive connection chromium holds.
            timeout_graceful_shutdown=5,
        )
    )
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn exited during start-up; its log is above")
            if time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start within {start_timeout_s} s")
            time.sleep(0.02)
        yield f"http://{LOCAL_HOST}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=start_timeout_s)
        sock.close()
    if thread.is_alive():
        raise RuntimeError("uvicorn did not shut down")


# ------------------------------------------------------------------ charts


def wait_for_chart(page: Page, chart_id: str, *, timeout_ms: float = 15_000) -> int:
    """Wait until plotly.js has drawn the chart with this element id; return its trace count."""
    page.locator(f"#{chart_id}.js-plotly-plot .main-svg").first.wait_for(
        state="attached", timeout=timeout_ms
    )
    return page.evaluate("(id) => document.getElementById(id).data.length", chart_id)


def chart_traces(page: Page, chart_id: str) -> list[dict[str, Any]]:
    """The chart's traces as plotly.js holds them: name, x and y of each."""
    return page.evaluate(
        """(id) => document.getElementById(id).data.map(
            (trace) => ({name: trace.name, x: Array.from(trace.x ?? []),
                         y: Array.from(trace.y ?? [])}))""",
        chart_id,
    )


def chart_markers(page: Page, chart_id: str) -> Locator:
    """The markers drawn in the chart's SVG (line-only traces draw none).

    A locator, so ``expect(chart_markers(page, id)).to_have_count(n)`` retries while plotly draws.
    """
    return page.locator(f"#{chart_id} .scatterlayer .point")
