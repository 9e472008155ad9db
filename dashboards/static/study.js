// Study page: draw the embedded figures, then keep the page live.
//
// Every 3 s it asks the trials API for trials numbered above a watermark: the highest number
// shown, or just below the lowest trial still running (so a running trial is re-read until it
// finishes). When a trial is new or changed state, it fetches this page again and swaps in the
// server-rendered sections marked data-live, and redraws the charts with Plotly.react. The
// tables and figures are therefore defined once, on the server.
(() => {
  "use strict";

  const POLL_MS = 3000;
  const MAX_BACKOFF_MS = 60000;
  // While the study runs, refresh now and then even when no trial changed (the study state).
  const FULL_REFRESH_EVERY = 10;
  const PLOT_CONFIG = { responsive: true, displaylogo: false };
  const CHARTS = { history: "chart-history", throughput: "chart-throughput" };

  let live = readLive(document);
  let known = trialStates(live.trials);
  let quietPolls = 0;
  let failures = 0;
  let timer = null;
  const status = document.getElementById("live-status");

  function readLive(doc) {
    return JSON.parse(doc.getElementById("study-data").textContent);
  }

  function trialStates(trials) {
    return new Map(trials.map((trial) => [trial.number, trial.state]));
  }

  function draw(figures, first) {
    if (!window.Plotly) {
      setStatus("Charts unavailable: plotly.js did not load.");
      return;
    }
    for (const [key, id] of Object.entries(CHARTS)) {
      const element = document.getElementById(id);
      const figure = figures[key];
      if (!element || !figure) continue;
      const plot = first ? window.Plotly.newPlot : window.Plotly.react;
      plot(element, figure.data, figure.layout, PLOT_CONFIG);
    }
  }

  function watermark() {
    let highest = -1;
    let lowestRunning = Infinity;
    for (const [number, state] of known) {
      highest = Math.max(highest, number);
      if (state === "running") lowestRunning = Math.min(lowestRunning, number);
    }
    return lowestRunning === Infinity ? highest : lowestRunning - 1;
  }

  async function fetchOk(url, accept) {
    const response = await fetch(url, { headers: { Accept: accept }, cache: "no-store" });
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    return response;
  }

  async function poll() {
    const url = `${live.trials_url}?after=${encodeURIComponent(watermark())}`;
    const trials = await (await fetchOk(url, "application/json")).json();
    const changed = trials.some((trial) => known.get(trial.number) !== trial.state);
    quietPolls = changed ? 0 : quietPolls + 1;
    if (changed || (live.study_state === "running" && quietPolls % FULL_REFRESH_EVERY === 0)) {
      await refresh();
    }
  }

  async function refresh() {
    const response = await fetchOk(window.location.href, "text/html");
    const next = new DOMParser().parseFromString(await response.text(), "text/html");
    // Same-origin HTML rendered by our autoescaping templates; scripts in it never run.
    for (const section of document.querySelectorAll("[data-live]")) {
      const replacement = next.getElementById(section.id);
      if (replacement) section.replaceChildren(...replacement.childNodes);
    }
    live = readLive(next);
    known = trialStates(live.trials);
    draw(live.figures, false);
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

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) schedule(0);
  });

  draw(live.figures, true);
  schedule(POLL_MS);
})();
