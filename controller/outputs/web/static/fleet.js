/* starpulse dashboard: the fleet report's plots (GET /api/fleet; controller/outputs/web/fleet.py).
   Fault rate by cause (stacked bars), MTTR and ETTR per job (lines), one point per day.
   Loaded after app.js, whose helpers it takes from window.starpulse. */
"use strict";

(function () {
  const sp = window.starpulse;
  const { $, el, svg, getJSON } = sp;
  const W = 480;
  const H = 160;
  const PAD = { l: 34, r: 6, t: 8, b: 16 };
  const COLOURS = ["#e5534b", "#d29922", "#4c8eda", "#2bb3a3", "#8a6fb3", "#e07b39", "#c9a227", "#ff2d55", "#2ea043", "#8793a3"];
  const REFRESH_MS = 60000; // the report is a month's history: once a minute is plenty

  function scale(series, top) {
    const n = Math.max(series.length, 1);
    const bw = (W - PAD.l - PAD.r) / n;
    const y = (v) => H - PAD.b - (top > 0 ? (v / top) * (H - PAD.t - PAD.b) : 0);
    return { bw, x: (i) => PAD.l + i * bw, y };
  }

  function frame(plot, top, unit) {
    plot.replaceChildren();
    plot.setAttribute("viewBox", `0 0 ${W} ${H}`);
    plot.setAttribute("preserveAspectRatio", "none");
    plot.append(svg("line", { class: "axis", x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b }));
    plot.append(svg("line", { class: "axis", x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b }));
    const label = svg("text", { x: 2, y: PAD.t + 8 });
    label.textContent = (top > 0 ? Number(top.toPrecision(3)) : 0) + unit;
    plot.append(label);
  }

  function legend(id, names) {
    $(id).replaceChildren(
      ...names.map((n, i) => el("span", {}, el("i", { style: "background:" + COLOURS[i % COLOURS.length] }), n)),
    );
  }

  function drawCauses(series, causes) {
    const used = causes.filter((c) => series.some((b) => (b.by_cause[c] || 0) > 0));
    const totals = series.map((b) => used.reduce((s, c) => s + (b.by_cause[c] || 0), 0));
    const top = Math.max(0, ...totals);
    const plot = $("fleet-causes");
    frame(plot, top, "");
    const sc = scale(series, top);
    series.forEach((b, i) => {
      let base = 0;
      used.forEach((c, k) => {
        const v = b.by_cause[c] || 0;
        if (v <= 0) return;
        const y0 = sc.y(base);
        const y1 = sc.y(base + v);
        plot.append(svg("rect", {
          class: "fleet-bar", "data-cause": c, "data-value": v, "data-bucket": i,
          x: sc.x(i) + 1, y: y1, width: Math.max(sc.bw - 2, 1), height: Math.max(y0 - y1, 0.5),
          fill: COLOURS[k % COLOURS.length],
        }));
        base += v;
      });
    });
    legend("fleet-causes-legend", used);
  }

  function drawLines(id, series, names, valueOf, unit, top) {
    const plot = $(id);
    const values = names.map((n) => series.map((b) => valueOf(b, n)));
    const max = top !== undefined ? top : Math.max(0, ...values.flat().filter((v) => v !== null && v !== undefined));
    frame(plot, max, unit);
    const sc = scale(series, max);
    names.forEach((n, k) => {
      const colour = COLOURS[k % COLOURS.length];
      const pts = [];
      values[k].forEach((v, i) => {
        if (v === null || v === undefined) return; // a day without the figure: no point, no zero
        const p = [sc.x(i) + sc.bw / 2, sc.y(v)];
        pts.push(p.join(","));
        plot.append(svg("circle", { class: "fleet-point", "data-series": n, "data-value": v, "data-bucket": i,
                                    cx: p[0], cy: p[1], r: 2.5, fill: colour }));
      });
      if (pts.length > 1) plot.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: colour }));
    });
    legend(id + "-legend", names);
  }

  function headline(report) {
    if (!report) return "";
    const f = report.faults;
    const rate = f.per_1000_gpu_days === null ? "–" : f.per_1000_gpu_days.toFixed(3);
    const pool = report.mttr.fault_to_node_back_in_pool.mean_s;
    const ettr = report.ettr.fleet;
    return `${f.total} faults, ${rate} per 1,000 GPU-days · MTTR to pool ` +
      (pool === null ? "–" : (pool / 3600).toFixed(2) + " h") +
      " · fleet ETTR " + (ettr === null ? "–" : (100 * ettr).toFixed(1) + " %") +
      ` · ${report.evictions.total} evictions, ${report.evictions.wrongful} wrongful`;
  }

  function render(data) {
    const series = data.series || [];
    const empty = !data.report || series.every((b) => !b.gpu_days && !b.faults);
    $("fleet-empty").hidden = !empty;
    $("fleet-headline").textContent = headline(data.report);
    drawCauses(series, data.causes || []);
    drawLines("fleet-mttr", series, ["to pool", "job resumed"],
      (b, n) => (n === "to pool" ? b.mttr_pool_h : b.mttr_job_h), " h");
    const jobs = [...new Set(series.flatMap((b) => Object.keys(b.ettr || {})))].sort();
    drawLines("fleet-ettr", series, jobs, (b, n) => (b.ettr || {})[n], "", 1);
    $("fleet-panel").dataset.loaded = "1"; // harnesses wait on this, never on time
  }

  async function load() {
    try {
      render(await getJSON("/api/fleet?days=30&buckets=30"));
    } catch (err) {
      console.warn("fleet report failed", err);
    }
  }

  sp.fleet = { render, load };
  if ($("fleet-panel")) {
    load();
    setInterval(load, REFRESH_MS);
  }
})();
