/* starpulse dashboard views beside the cluster page: a node's page, jobs, the events feed.
   Loaded after app.js, whose helpers it takes from window.starpulse. */
"use strict";

(function () {
  const sp = window.starpulse;
  const { $, el, svg, getJSON, fmtClock, fmtAgo, lifecycleOf } = sp;
  const SERIES = [
    ["temperature_c", "hottest GPU", "°C"],
    ["power_w", "GPU power", "W"],
    ["utilization_pct", "GPU utilisation", "%"],
    ["ecc_dbe", "volatile DBE", ""],
  ];

  // -- node page -----------------------------------------------------------------------------

  function nodeFromHash() {
    return location.hash.startsWith("#node/") ? decodeURIComponent(location.hash.slice(6)) : null;
  }

  function num(v, digits) {
    if (v === null || v === undefined) return "–";
    return digits === undefined ? String(v) : Number(v).toFixed(digits);
  }

  function showView() {
    const name = nodeFromHash();
    $("main-view").hidden = !!name;
    $("node-view").hidden = !name;
    if (name) loadNode(name);
  }

  async function loadNode(name) {
    $("node-title").textContent = name;
    document.body.dataset.nodeReady = "";
    try {
      const path = "/api/node/" + encodeURIComponent(name);
      const [node, events, history] = await Promise.all([
        getJSON(path),
        getJSON("/api/events?node=" + encodeURIComponent(name) + "&limit=30"),
        getJSON(path + "/history"),
      ]);
      if (nodeFromHash() !== name) return; // the operator moved on
      renderNode(node, events.events || []);
      renderHistory(history);
    } catch (err) {
      $("node-meta").textContent = String(err.message || err);
      $("node-facts").replaceChildren();
    }
    document.body.dataset.nodeReady = name;
  }

  function fact(term, value) {
    return [el("dt", { text: term }), el("dd", { text: value === "" || value === null || value === undefined ? "–" : String(value) })];
  }

  function renderNode(node, events) {
    const life = lifecycleOf(node) || "in_service";
    const since = node.lifecycle_since_ms ? fmtClock(node.lifecycle_since_ms) + " (" + fmtAgo(node.lifecycle_since_ms) + ")" : "";
    const first = node.gpus[0] || {};
    $("node-meta").textContent = (node.state === "unknown" ? "never seen" : node.state) + " · seen " + fmtAgo(node.last_seen_ms);
    $("node-facts").replaceChildren(
      ...fact("lifecycle", life.replace("_", " ")),
      ...fact("since", since),
      ...fact("why", node.lifecycle_reason),
      ...fact("vendor", first.vendor),
      ...fact("model", first.model),
      ...fact("hostname", node.hostname),
      ...fact("agent", node.agent_version),
      // Only when it happened: another client took this node's stream over (see its agent_conflict incident).
      ...(node.stream_takeovers ? fact("stream taken over", node.stream_takeovers + " times by another claimant of this node") : []),
      // Only when off: an agent clock past the controller's limit (its stamps shown with their date).
      ...(node.clock_skew_s == null
        ? []
        : fact("agent clock", (node.clock_skew_s > 0 ? "+" : "") + node.clock_skew_s + " s off this controller's (last report stamped " + fmtClock(node.report_ms) + ")")),
    );
    $("node-facts").dataset.lifecycle = life;
    $("node-gpus").tBodies[0].replaceChildren(...node.gpus.map(gpuRow));
    $("node-nics").tBodies[0].replaceChildren(...node.nics.map(nicRow));
    $("node-events").replaceChildren(...events.map(eventItem));
    $("node-events-empty").hidden = events.length > 0;
  }

  function gpuRow(g) {
    const links = g.nvlink_total ? g.nvlink_up + "/" + g.nvlink_total + " up" + (g.nvlink_down.length ? " (down: " + g.nvlink_down.join(", ") + ")" : "") : "–";
    const hot = g.ecc_dbe_volatile || g.lost || g.nvlink_down.length;
    return el(
      "tr",
      { class: hot ? "has-incident st-critical" : "", "data-gpu": g.index },
      el("td", { class: "num", text: g.index }),
      el("td", { text: g.model || "–" }),
      el("td", { class: "num", text: num(g.temperature_c, 0) }),
      el("td", { class: "num", text: num(g.memory_temperature_c, 0) }),
      el("td", { class: "num", text: num(g.power_w, 0) }),
      el("td", { class: "num", text: num(g.power_limit_w, 0) }),
      el("td", { class: "num", text: num(g.utilization_gpu_pct, 0) }),
      el("td", { class: "num", text: num(g.ecc_sbe_volatile) }),
      el("td", { class: "num", text: num(g.ecc_dbe_volatile) }),
      el("td", { text: g.lost ? "GPU lost" : links }),
    );
  }

  function nicRow(n) {
    return el(
      "tr",
      { class: n.state && n.state !== "ACTIVE" ? "has-incident st-critical" : "", "data-nic": n.device },
      el("td", { text: n.device }),
      el("td", { text: n.netdev || "–" }),
      el("td", { text: n.link_layer || "–" }),
      el("td", { text: (n.state || "–") + (n.phys_state ? " / " + n.phys_state : "") }),
      el("td", { class: "num", text: num(n.rate_gbps, 0) }),
      el("td", { class: "num", text: num(n.rx_bytes) }),
      el("td", { class: "num", text: num(n.tx_bytes) }),
    );
  }

  function eventItem(e) {
    const sev = (e.severity || "info").toLowerCase();
    return el(
      "li",
      { class: "incident sev-" + sev, "data-seq": e.seq },
      el(
        "div",
        { class: "inc-head" },
        el("span", { class: "sev sev-" + sev, text: sev }),
        el("span", { class: "kind", text: e.kind }),
        el("a", { class: "node-link", href: "#node/" + encodeURIComponent(e.node), text: e.node }),
        el("span", { class: "rc", text: e.component || "" }),
        el("time", { text: fmtClock(e.timestamp_ms) + " · " + fmtAgo(e.timestamp_ms) }),
      ),
      el("div", { class: "inc-body", text: e.message || "" }),
    );
  }

  /** One small line chart per metric: the controller's own recent samples (web/history.py). */
  function renderHistory(h) {
    const box = $("node-history");
    const span = h.t_ms.length > 1 ? fmtDurationS((h.t_ms[h.t_ms.length - 1] - h.t_ms[0]) / 1000) : "";
    $("node-history-meta").textContent = h.t_ms.length + " samples every " + h.step_s + " s" + (span ? " · last " + span : "");
    box.replaceChildren(...SERIES.map(([key, label, unit]) => spark(label, unit, h.series[key] || [])));
  }

  function fmtDurationS(s) {
    return s < 120 ? Math.round(s) + " s" : Math.round(s / 60) + " min";
  }

  function spark(label, unit, values) {
    const W = 220;
    const H = 44;
    const nums = values.filter((v) => v !== null);
    const last = nums.length ? nums[nums.length - 1] : null;
    const fig = el("figure", { class: "spark", "data-series": label });
    fig.append(el("figcaption", {}, label + " ", el("b", { text: last === null ? "–" : String(Math.round(last)) + (unit ? " " + unit : "") })));
    const chart = svg("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img", "aria-label": label });
    if (nums.length > 1) {
      const lo = Math.min(...nums);
      const hi = Math.max(...nums);
      const pts = [];
      values.forEach((v, i) => {
        if (v === null) return;
        const x = (i / (values.length - 1)) * (W - 4) + 2;
        const y = hi === lo ? H / 2 : H - 4 - ((v - lo) / (hi - lo)) * (H - 8);
        pts.push(x.toFixed(1) + "," + y.toFixed(1));
      });
      chart.append(svg("polyline", { points: pts.join(" "), class: "spark-line" }));
    }
    fig.append(chart);
    return fig;
  }

  // -- jobs and events ------------------------------------------------------------------------

  function renderJobs(jobs) {
    $("jobs").tBodies[0].replaceChildren(...jobs.map(jobRow));
    $("jobs-empty").hidden = jobs.length > 0;
    $("jobs-meta").textContent = jobs.length ? jobs.length + (jobs.length === 1 ? " job" : " jobs") : "";
  }

  function jobRow(j) {
    const ckpt = j.last_complete_step ? "step " + j.last_complete_step + (j.last_checkpoint_ms ? " · " + fmtAgo(j.last_checkpoint_ms) : "") : "none yet";
    return el(
      "tr",
      { id: "job-" + j.job, class: j.state !== "running" ? "has-incident st-warning" : "", "data-job": j.job },
      el("td", { text: j.job }),
      el("td", { text: j.state }),
      el("td", { class: "num", text: j.step }),
      el("td", { text: ckpt }),
      el("td", { class: "num", text: j.restarts }),
      el("td", { class: "num", text: j.downtime_s ? Math.round(j.downtime_s) + " s" : "0" }),
      el("td", { text: (j.nodes || []).length + " nodes" }),
    );
  }

  function renderEvents(events) {
    $("events").replaceChildren(...events.map(eventItem));
    $("events-empty").hidden = events.length > 0;
  }

  /** A snapshot page embeds the cluster data only; jobs and events follow with one fetch each. */
  async function loadExtras() {
    try {
      const [jobs, events] = await Promise.all([getJSON("/api/jobs"), getJSON("/api/events?limit=50")]);
      renderJobs(jobs.jobs || []);
      renderEvents(events.events || []);
    } catch (err) {
      console.warn("jobs/events fetch failed", err);
    }
  }

  sp.views = { showView, loadNode, renderJobs, renderEvents, loadExtras };
})();
