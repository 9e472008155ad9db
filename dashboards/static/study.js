// Study page: draw the charts, keep the page live, copy the recommended config.
//
// The HTML arrives without chart data so it paints at once; the figures come from
// figures_url as Plotly JSON, and the importance chart (the slowest to compute) from
// importance_url after the others are drawn. Each chart is drawn in its own task, history first,
// so the browser paints each as it is ready. Every 3 s the page asks the trials API for trials numbered above
// a watermark: the highest number shown, or just below the lowest trial still running (so a
// running trial is re-read until it finishes). When a trial is new or changed state, it fetches
// this page again, swaps in the server-rendered sections marked data-live, and redraws the
// charts with Plotly.react. Tables and figures are therefore defined once, on the server.
(() => {
  "use strict";

  const POLL_MS = 3000;
  const MAX_BACKOFF_MS = 60000;
  // While the study runs, refresh now and then even when no trial changed (the study state).
  const FULL_REFRESH_EVERY = 10;
  const PLOT_CONFIG = { responsive: true, displaylogo: false };
  // In drawing order.
  const CHARTS = {
    history: "chart-history",
    throughput: "chart-throughput",
    failures: "chart-failures",
    pareto: "chart-pareto",
    parallel: "chart-parallel",
    slice: "chart-slice",
    importance: "chart-importance",
  };

  let live = readLive(document);
  let quietPolls = 0;
  let failures = 0;
  let timer = null;
  let drawn = false;
  const status = document.getElementById("live-status");

  function readLive(doc) {
    return JSON.parse(doc.getElementById("study-data").textContent);
  }

  async function drawFigures() {
    // This script runs before plotly.js (see the page's head): the chart data downloads
    // while the browser parses plotly.js, and the server computes importance while the
    // browser draws the others.
    const main = fetchJson(live.figures_url);
    main.catch(() => {}); // awaited below; handled there
    const Plotly = await plotlyLoaded();
    if (!Plotly) {
      setStatus("Charts unavailable: plotly.js did not load.");
      return;
    }
    const plot = drawn ? Plotly.react : Plotly.newPlot;
    const figures = await main;
    const slow = fetchJson(live.importance_url);
    slow.catch(() => {});
    await drawEach(plot, figures);
    await drawEach(plot, await slow);
    drawn = true;
    document.body.dataset.chartsDrawn = String(Date.now());
  }

  async function drawEach(plot, figures) {
    for (const [key, id] of Object.entries(CHARTS)) {
      const element = document.getElementById(id);
      const figure = figures[key];
      if (!element || !figure) continue;
      if (key === "failures") {
        // no failed trial: no card spent on saying so (it comes back when one fails)
        const box = element.closest(".chart-box");
        const failed = (figure.data || []).some((t) => Array.isArray(t.x) && t.x.length > 0);
        if (box) box.hidden = !failed;
        if (!failed) continue;
      }
      await plot(element, figure.data, figure.layout, PLOT_CONFIG);
      await nextPaint();
    }
  }

  // plotly.js is deferred after this script: it has run by DOMContentLoaded (or failed).
  function plotlyLoaded() {
    if (window.Plotly || document.readyState === "complete") {
      return Promise.resolve(window.Plotly);
    }
    return new Promise((resolve) => {
      const done = () => resolve(window.Plotly);
      document.addEventListener("DOMContentLoaded", done, { once: true });
      window.addEventListener("load", done, { once: true });
    });
  }

  async function fetchJson(url) {
    return (await fetchOk(url, "application/json")).json();
  }

  // Resolves after the browser has painted what is drawn so far (at once in a hidden tab,
  // which runs no animation frames).
  function nextPaint() {
    return new Promise((resolve) => {
      if (document.hidden) setTimeout(resolve, 0);
      else requestAnimationFrame(() => setTimeout(resolve, 0));
    });
  }

  function watermark() {
    const lowestRunning = Math.min(...live.running);
    return Number.isFinite(lowestRunning) ? lowestRunning - 1 : live.highest;
  }

  async function fetchOk(url, accept) {
    const response = await fetch(url, { headers: { Accept: accept }, cache: "no-store" });
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    return response;
  }

  async function poll() {
    const url = `${live.trials_url}?after=${encodeURIComponent(watermark())}`;
    const trials = await fetchJson(url);
    const running = new Set(live.running);
    const changed = trials.some(
      (trial) =>
        trial.number > live.highest || (running.has(trial.number) && trial.state !== "running"),
    );
    quietPolls = changed ? 0 : quietPolls + 1;
    if (changed || (live.study_state === "running" && quietPolls % FULL_REFRESH_EVERY === 0)) {
      await refresh(changed);
    }
  }

  async function refresh(redraw) {
    // A page whose offers form was filled in wrong is served as a 422 with the form's error:
    // its live sections are whole all the same
    const response = await fetch(window.location.href, {
      headers: { Accept: "text/html" },
      cache: "no-store",
    });
    if (!response.ok && response.status !== 422) {
      throw new Error(`${window.location.href}: HTTP ${response.status}`);
    }
    const next = new DOMParser().parseFromString(await response.text(), "text/html");
    // Same-origin HTML rendered by our autoescaping templates; scripts in it never run.
    for (const section of document.querySelectorAll("[data-live]")) {
      const replacement = next.getElementById(section.id);
      if (replacement) section.replaceChildren(...replacement.childNodes);
    }
    live = readLive(next);
    if (redraw) await drawFigures();
  }

  function setStatus(text) {
    if (status) status.textContent = text;
  }

  function schedule(delay) {
    clearTimeout(timer);
    timer = setTimeout(tick, delay);
  }

  async function tick() {
    if (document.hidden) return; // resumed by visibilitychange
    try {
      await poll();
      failures = 0;
      setStatus(`Live · checked ${new Date().toLocaleTimeString()}`);
      schedule(POLL_MS);
    } catch (error) {
      failures += 1;
      const delay = Math.min(POLL_MS * 2 ** failures, MAX_BACKOFF_MS);
      setStatus(`Cannot reach the server (${error.message}); retrying in ${delay / 1000} s.`);
      schedule(delay);
    }
  }

  // Copy buttons (delegated: the card is replaced on live updates).
  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return;
    }
    // Plain http on a non-loopback address has no clipboard API: select and copy instead.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.append(area);
    area.select();
    const copied = document.execCommand("copy");
    area.remove();
    if (!copied) throw new Error("the browser refused to copy");
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    const label = button.textContent;
    try {
      await copyText(source.textContent);
      button.textContent = "Copied ✓";
    } catch (error) {
      button.textContent = `Copy failed: ${error.message}`;
    }
    setTimeout(() => {
      button.textContent = label;
    }, 2000);
  });

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) schedule(0);
  });

  drawFigures()
    .catch((error) => setStatus(`Charts failed to load (${error.message}).`))
    .finally(() => schedule(POLL_MS));
})();
