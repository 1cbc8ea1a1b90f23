/* starpulse dashboard: plain JS, no build step, no network beyond this controller. */
"use strict";

(function () {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const POLL_MS = 5000; // fallback when the event stream is down
  const REFRESH_MS = 15000; // last-seen times move even when nothing "changes"
  const SEVERITY_RANK = { ok: -1, info: 0, warning: 1, critical: 2, fatal: 3 };
  const COLLAPSE_ABOVE = 256; // nodes: past this, blocks that need no look start collapsed

  const state = {
    fabric: null,
    incidents: [],
    nodes: [],
    jobs: [],
    events: [],
    summary: null,
    byId: new Map(),
    version: null,
    mode: "connecting",
    loading: false,
    again: false,
    pollTimer: null,
    expanded: null, // block numbers the operator chose to draw (null: the ones that need a look)
  };

  // -- small helpers ------------------------------------------------------------------------

  function $(id) {
    return document.getElementById(id);
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, String(v));
    }
  }

  async function getJSON(url) {
    const resp = await fetch(url, { cache: "no-store" });
    if (!resp.ok) throw new Error(url + ": HTTP " + resp.status);
    return resp.json();
  }

  function fmtClock(ms) {
    if (!ms) return "–";
    const when = new Date(Number(ms));
    // More than 12 h from now (an old event, or an agent whose clock is off): with its date,
    // or a day-old stamp reads as a fresh one.
    if (Math.abs(Date.now() - when.getTime()) > 12 * 3600 * 1000) {
      return when.toLocaleString([], { hour12: false, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit" });
    }
    return when.toLocaleTimeString([], { hour12: false });
  }

  function fmtAgo(ms) {
    if (!ms) return "never";
    const ahead = Math.round((Number(ms) - Date.now()) / 1000);
    if (ahead > 60) return fmtDuration(ahead * 1000) + " ahead of this clock";
    const s = Math.max(0, Math.round((Date.now() - Number(ms)) / 1000));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h ago";
    return Math.floor(s / 86400) + " d ago";
  }

  function fmtDuration(ms) {
    const s = Math.round(ms / 1000);
    if (s < 90) return s + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function incidentsOf(item) {
    return (item.root_cause_of || []).concat(item.affected_by || []);
  }

  function listNodes(names, max) {
    if (names.length <= max) return names.join(", ");
    return names.slice(0, max).join(", ") + " +" + (names.length - max) + " more";
  }

  // Shared with views.js (the node page, jobs, events), which loads after this file.
  const sp = (window.starpulse = window.starpulse || {});
  Object.assign(sp, { $, el, svg, getJSON, fmtClock, fmtAgo, fmtDuration, lifecycleOf: (item) => lifecycleOf(item) });

  // -- data ---------------------------------------------------------------------------------

  async function refresh() {
    if (state.loading) {
      state.again = true;
      return;
    }
    state.loading = true;
    try {
      const [fabric, incidents, summary, nodes, jobs, events] = await Promise.all([
        getJSON("/api/fabric"),
        getJSON("/api/incidents?all=1&limit=200"),
        getJSON("/api/summary"),
        getJSON("/api/nodes"),
        getJSON("/api/jobs"),
        getJSON("/api/events?limit=50"),
      ]);
      apply({ fabric, incidents, summary, nodes, jobs, events });
      render();
      if (state.mode === "offline") setMode(isSnapshot() ? "snapshot" : "polling");
    } catch (err) {
      console.warn("refresh failed", err);
      setMode("offline");
    } finally {
      state.loading = false;
      if (state.again) {
        state.again = false;
        refresh();
      }
    }
  }

  /** Take one set of API answers (fetched, or embedded in a snapshot page). */
  function apply(data) {
    state.fabric = data.fabric;
    state.incidents = data.incidents.incidents;
    state.byId = new Map(state.incidents.map((i) => [i.id, i]));
    state.summary = data.summary;
    state.nodes = data.nodes.nodes || [];
    state.jobs = data.jobs ? data.jobs.jobs || [] : state.jobs;
    state.events = data.events ? data.events.events || [] : state.events;
  }

  /** The data a ``?live=0`` page carries inside itself (see controller/outputs/web/page.py), or null. */
  function embedded() {
    const slot = $("snapshot");
    const text = slot ? slot.textContent.trim() : "";
    return text ? JSON.parse(text) : null;
  }

  function render() {
    renderSummary(state.summary);
    renderFabric(state.fabric);
    renderIncidents(state.incidents);
    renderNodes();
    renderNodeNames();
    sp.views.renderJobs(state.jobs);
    sp.views.renderEvents(state.events);
    document.body.dataset.version = String(state.summary ? state.summary.version : "");
    // Harnesses wait on this (never on time): the page shows the data it has.
    document.body.dataset.ready = "1";
  }

  // -- header -------------------------------------------------------------------------------

  function chip(label, value, cls) {
    return el("span", { class: "chip " + (cls || "") }, el("b", { text: value }), " " + label);
  }

  function renderSummary(summary) {
    const box = $("summary");
    box.replaceChildren();
    if (!summary) return;
    const n = summary.nodes;
    box.append(chip("online", n.online || 0, "ok"));
    if (n.unreachable) box.append(chip("unreachable", n.unreachable, "bad"));
    if (n.unknown) box.append(chip("never seen", n.unknown, ""));
    // Nodes out of service or coming back, by lifecycle state (in service is the rest).
    for (const [life, count] of Object.entries(summary.lifecycle || {})) {
      if (count && life !== "in_service") box.append(chip(life.replace("_", " "), count, "life life-" + life));
    }
    const open = summary.incidents.open;
    box.append(chip(open === 1 ? "open incident" : "open incidents", open, open ? "warn" : "ok"));
    for (const [kind, count] of Object.entries(summary.incidents.by_kind)) {
      box.append(chip(kind, count, "kind"));
    }
    if (summary.spares) {
      const sp = summary.spares;
      const short = sp.available < (sp.target || 0);
      box.append(chip("spares (target " + (sp.target || 0) + ")", sp.available, short ? (sp.available ? "warn" : "bad") : "ok"));
    }
    renderBreaker(summary.breaker || {});
  }

  function renderBreaker(breaker) {
    const node = $("breaker");
    const st = breaker.state || "unknown";
    node.dataset.state = st;
    node.replaceChildren("breaker: ", el("b", { text: st }));
    if (breaker.available === false) node.append(el("span", { class: "na", text: " (n/a)" }));
    else if (st === "open" && breaker.open_for) node.append(el("span", { text: " for " + breaker.open_for }));
    node.title = breaker.reason ? "self-healing circuit breaker: " + breaker.reason : "self-healing circuit breaker";
  }

  function setMode(mode) {
    state.mode = mode;
    const node = $("live");
    node.dataset.mode = mode;
    node.textContent = { live: "live", polling: "polling every 5 s", offline: "controller unreachable", snapshot: "snapshot" }[mode] || mode;
  }

  // -- fabric layout ------------------------------------------------------------------------

  /** Glyph sizes by fabric size: labels while they fit, small squares for big fabrics. */
  function scaleFor(nodeCount, rails) {
    if (nodeCount <= 64 && rails <= 8) return { leafW: 66, leafH: 24, nodeW: 66, nodeH: 22, gap: 6, labels: true, spineW: 86 };
    if (nodeCount <= 256) return { leafW: 26, leafH: 16, nodeW: 26, nodeH: 14, gap: 4, labels: false, spineW: 60 };
    return { leafW: 10, leafH: 10, nodeW: 10, nodeH: 8, gap: 2, labels: false, spineW: 40, tiny: true };
  }

  function layoutFabric(f, width) {
    const blocks = f.blocks.length ? f.blocks : [{ block: "", leaves: [], nodes: f.nodes }];
    const nodeCount = blocks.reduce((n, b) => n + b.nodes.length, 0);
    const rails = Math.max(1, f.rails.length);
    const s = scaleFor(nodeCount, rails);
    const pad = 10;
    const railW = rails * (s.leafW + s.gap) - s.gap;
    const maxNodes = Math.max(1, ...blocks.map((b) => b.nodes.length));
    let cols = Math.max(1, Math.floor((railW + s.gap) / (s.nodeW + s.gap)));
    if (!f.blocks.length) cols = Math.max(1, Math.floor((width - 2 * pad) / (s.nodeW + s.gap)));
    else if (cols < 4) cols = Math.min(maxNodes, 4);
    const gridW = cols * (s.nodeW + s.gap) - s.gap;
    const blockW = Math.max(railW, gridW) + 2 * pad;
    const blockGap = s.tiny ? 12 : 18;
    const perRow = Math.max(1, Math.floor((width - 20 + blockGap) / (blockW + blockGap)));
    const rows = Math.ceil(maxNodes / cols);
    const titleH = s.tiny ? 14 : 18;
    const linkGap = s.labels ? 34 : s.tiny ? 10 : 18;
    const blockH = titleH + (f.blocks.length ? s.leafH + linkGap : 0) + rows * (s.nodeH + s.gap) + pad;
    const spines = f.spines || [];
    const spineGap = 10;
    const spineW = spines.length ? Math.min(s.spineW, (width - 40) / spines.length - spineGap) : 0;
    const spineH = s.labels ? 26 : 16;
    const spineTop = 14;
    const blocksTop = spines.length ? spineTop + spineH + (perRow >= blocks.length ? 70 : 40) : 10;
    const usedRows = Math.ceil(blocks.length / perRow);
    const usedW = Math.min(blocks.length, perRow) * (blockW + blockGap) - blockGap;
    const left = Math.max(10, (width - usedW) / 2);
    return {
      s, pad, cols, blocks, blockW, blockH, blockGap, perRow, titleH, linkGap, left,
      spines, spineW, spineH, spineTop, spineGap, blocksTop,
      singleRow: usedRows === 1,
      height: blocksTop + usedRows * (blockH + blockGap) - blockGap + 6,
      width,
    };
  }

  function blockOrigin(L, i) {
    const col = i % L.perRow;
    const row = Math.floor(i / L.perRow);
    return { x: L.left + col * (L.blockW + L.blockGap), y: L.blocksTop + row * (L.blockH + L.blockGap) };
  }

  // -- fabric drawing -----------------------------------------------------------------------

  /** A fabric spare without a lifecycle row is simply a spare (it may never have reported). */
  function lifecycleOf(item) {
    if (item.lifecycle && item.lifecycle !== "in_service") return item.lifecycle;
    return item.spare ? "spare" : item.lifecycle || null;
  }

  function statusClasses(item) {
    const cls = ["st-" + (item.status || "ok")];
    if ((item.root_cause_of || []).length) cls.push("fault");
    else if ((item.affected_by || []).length) cls.push("affected");
    const life = lifecycleOf(item);
    // A spare that never reported is drawn as a spare, not as "never seen".
    if (item.state && !(item.state === "unknown" && life === "spare")) cls.push(item.state);
    if (life && life !== "in_service") cls.push("life-" + life);
    return cls.join(" ");
  }

  /** One element: a <g> with id/class/data-*, wrapped content in an <a> when incidents name it. */
  function drawElement(parent, item, id, kind, box, label) {
    const ids = incidentsOf(item);
    const g = svg("g", {
      id: id,
      class: kind + " " + statusClasses(item),
      "data-name": item.name,
      "data-status": item.status || "ok",
      "data-state": item.state || null,
      "data-lifecycle": lifecycleOf(item),
      "data-incident": ids[0] || null,
      "data-incidents": ids.length ? ids.join(" ") : null,
      "aria-label": item.name + (ids.length ? " (" + item.status + ": " + ids.join(", ") + ")" : ""),
    });
    const holder = ids.length ? svg("a", { href: "#incident-" + ids[0] }) : g;
    if (holder !== g) g.append(holder);
    if ((item.root_cause_of || []).length) {
      holder.append(svg("rect", { class: "halo", x: box.x - 4, y: box.y - 4, width: box.w + 8, height: box.h + 8, rx: 5 }));
    }
    holder.append(svg("rect", { class: "glyph", x: box.x, y: box.y, width: box.w, height: box.h, rx: Math.min(4, box.h / 4) }));
    if (label) {
      holder.append(svg("text", { x: box.x + box.w / 2, y: box.y + box.h / 2 + 4, "text-anchor": "middle", text: label }));
    }
    parent.append(g);
    return g;
  }

  function line(parent, a, b, cls) {
    parent.append(svg("line", { class: cls, x1: a.x, y1: a.y, x2: b.x, y2: b.y }));
  }

  function cableClass(item) {
    return item && (item.root_cause_of || []).length ? "cable st-" + item.status : "cable";
  }

  // -- collapsible blocks (large fabrics) ------------------------------------------------------

  /** A block needs no look: no incident touches it, every node is reachable and in service (or a spare). */
  function blockHealthy(b) {
    const items = b.leaves.concat(b.nodes);
    return items.every(
      (it) => !incidentsOf(it).length && it.state !== "unreachable" && ["in_service", "spare", null].includes(lifecycleOf(it)),
    );
  }

  /** Blocks drawn in full. Small fabrics: all. Large ones: those that need a look, until the operator picks. */
  function expandedBlocks(f) {
    const nodeCount = f.blocks.reduce((n, b) => n + b.nodes.length, 0);
    if (nodeCount <= COLLAPSE_ABOVE) return f.blocks;
    if (state.expanded === null) return f.blocks.filter((b) => !blockHealthy(b));
    return f.blocks.filter((b) => state.expanded.has(b.block));
  }

  function renderBlockChips(f, shown) {
    const box = $("block-chips");
    const collapsible = f.blocks.reduce((n, b) => n + b.nodes.length, 0) > COLLAPSE_ABOVE;
    box.hidden = !collapsible;
    if (!collapsible) return box.replaceChildren();
    const open = new Set(shown.map((b) => b.block));
    const chips = f.blocks.map((b) => {
      const worst = b.leaves.concat(b.nodes).reduce((w, it) => (SEVERITY_RANK[it.status || "ok"] > SEVERITY_RANK[w] ? it.status : w), "ok");
      const bad = b.nodes.filter((n) => incidentsOf(n).length || n.state === "unreachable").length;
      const label = "block " + b.block + " · " + b.nodes.length + " nodes" + (bad ? " · " + bad + " need a look" : "");
      const chip = el("button", {
        type: "button",
        class: "block-chip st-" + worst + (blockHealthy(b) ? "" : " attention"),
        id: "block-chip-" + b.block,
        "data-block": b.block,
        "aria-expanded": open.has(b.block) ? "true" : "false",
        title: open.has(b.block) ? "collapse this block" : "draw this block's nodes",
        text: label,
      });
      chip.addEventListener("click", () => toggleBlock(f, b.block));
      return chip;
    });
    const all = el("button", { type: "button", class: "block-chip all", id: "blocks-expand-all", text: "expand all" });
    all.addEventListener("click", () => {
      state.expanded = new Set(f.blocks.map((b) => b.block));
      renderFabric(state.fabric);
    });
    box.replaceChildren(...chips, all);
  }

  function toggleBlock(f, block) {
    if (state.expanded === null) state.expanded = new Set(expandedBlocks(f).map((b) => b.block));
    if (state.expanded.has(block)) state.expanded.delete(block);
    else state.expanded.add(block);
    renderFabric(state.fabric);
  }

  function renderFabric(full) {
    const root = $("fabric-svg");
    const hasAny = full && (full.blocks.length || full.nodes.length);
    $("fabric-empty").hidden = !!hasAny;
    root.replaceChildren();
    if (!hasAny) {
      root.setAttribute("height", "0");
      return;
    }
    const shown = expandedBlocks(full);
    renderBlockChips(full, shown);
    renderFabricMeta(full);
    if (full.blocks.length && !shown.length) {
      root.setAttribute("height", "0"); // every block collapsed: the chips say it all
      return;
    }
    const f = Object.assign({}, full, { blocks: shown });
    const width = Math.max(640, $("fabric").clientWidth || 1200);
    const L = layoutFabric(f, width);
    root.setAttribute("viewBox", "0 0 " + width + " " + L.height);
    root.setAttribute("height", String(L.height));
    const pos = new Map();
    const layers = { bg: svg("g", { class: "backdrop" }), cables: svg("g", { class: "cables" }), shapes: svg("g", { class: "shapes" }) };
    root.append(layers.bg, layers.cables, layers.shapes);
    const cables = layers.cables;
    drawSpines(layers.shapes, L, pos);
    L.blocks.forEach((b, i) => drawBlock(layers, L, b, i, pos));
    drawUplinks(cables, L, pos);
    drawProbeLinks(root, f.probes || [], pos);
    drawFaultyLinks(root, f.links || [], pos);
  }

  function renderFabricMeta(f) {
    const s = f.summary;
    $("fabric-meta").textContent = s
      ? s.node + " nodes · " + s.blocks + " blocks · " + s.rails + " rails · " + s.leaf + " leaves · " + s.spine + " spines"
      : f.nodes.length + " nodes (no fabric declared)";
  }

  function drawSpines(parent, L, pos) {
    const n = L.spines.length;
    if (!n) return;
    const total = n * (L.spineW + L.spineGap) - L.spineGap;
    let x = (L.width - total) / 2;
    const labels = L.spineW >= 50;
    for (const sp of L.spines) {
      const box = { x: x, y: L.spineTop, w: L.spineW, h: L.spineH };
      drawElement(parent, sp, "sw-" + sp.name, "switch spine", box, labels ? sp.name : null);
      pos.set(sp.name, { x: x + L.spineW / 2, y: L.spineTop + L.spineH, item: sp, box });
      x += L.spineW + L.spineGap;
    }
  }

  function drawBlock(layers, L, b, i, pos) {
    const o = blockOrigin(L, i);
    const s = L.s;
    const shapes = layers.shapes;
    layers.bg.append(svg("rect", { class: "block-bg", x: o.x, y: o.y, width: L.blockW, height: L.blockH, rx: 6 }));
    const title = b.block === "" ? "nodes" : (L.s.tiny ? "b" : "block ") + b.block;
    layers.bg.append(svg("text", { class: "title", x: o.x + L.pad, y: o.y + 13, text: title.toUpperCase() }));
    let y = o.y + L.titleH + 4;
    const leafPos = [];
    b.leaves.forEach((leaf, r) => {
      const box = { x: o.x + L.pad + r * (s.leafW + s.gap), y: y, w: s.leafW, h: s.leafH };
      const label = s.labels ? "r" + leaf.rail : null;
      drawElement(shapes, leaf, "sw-" + leaf.name, "switch leaf", box, label);
      const p = { x: box.x + box.w / 2, top: box.y, y: box.y + box.h, item: leaf, box };
      pos.set(leaf.name, p);
      leafPos.push(p);
    });
    if (b.leaves.length) y += s.leafH + L.linkGap;
    const nodePos = b.nodes.map((node, k) => drawNode(shapes, L, node, o, y, k, pos));
    drawNodeCables(layers.cables, L, leafPos, nodePos, y);
  }

  function drawNode(parent, L, node, o, y, k, pos) {
    const s = L.s;
    const col = k % L.cols;
    const row = Math.floor(k / L.cols);
    const box = { x: o.x + L.pad + col * (s.nodeW + s.gap), y: y + row * (s.nodeH + s.gap), w: s.nodeW, h: s.nodeH };
    const label = s.labels ? node.name.replace(/^node-/, "n") : null;
    const kind = "node" + (node.spare ? " spare" : "");
    drawElement(parent, node, "nd-" + node.name, kind, box, label);
    const p = { x: box.x + box.w / 2, y: box.y, item: node, box };
    pos.set(node.name, p);
    return p;
  }

  /** Node-leaf cables: every cable for small blocks, else a bus under the leaf row. */
  function drawNodeCables(parent, L, leafPos, nodePos, nodesTop) {
    if (!leafPos.length || !nodePos.length) return;
    if (leafPos.length * nodePos.length <= 64) {
      for (const lp of leafPos) {
        for (const np of nodePos) line(parent, { x: lp.x, y: lp.y }, { x: np.x, y: np.y }, cableClass(lp.item));
      }
      return;
    }
    const busY = nodesTop - L.linkGap / 2;
    const xs = leafPos.map((p) => p.x).concat(nodePos.map((p) => p.x));
    line(parent, { x: Math.min(...xs), y: busY }, { x: Math.max(...xs), y: busY }, "cable bus");
    for (const lp of leafPos) line(parent, { x: lp.x, y: lp.y }, { x: lp.x, y: busY }, cableClass(lp.item));
    const seen = new Set();
    for (const np of nodePos) {
      if (seen.has(np.x)) continue;
      seen.add(np.x);
      line(parent, { x: np.x, y: busY }, { x: np.x, y: nodesTop }, "cable");
    }
  }

  /** Leaf-spine cables: each one when the fabric is small, else one trunk per block. */
  function drawUplinks(parent, L, pos) {
    if (!L.spines.length) return;
    const leaves = L.blocks.flatMap((b) => b.leaves);
    if (L.singleRow && leaves.length * L.spines.length <= 96) {
      for (const leaf of leaves) {
        const lp = pos.get(leaf.name);
        for (const k of leaf.spines || []) {
          const sp = pos.get(L.spines[k].name);
          const hot = (leaf.root_cause_of || []).length ? leaf : sp.item;
          line(parent, { x: sp.x, y: sp.y }, { x: lp.x, y: lp.top }, cableClass(hot));
        }
      }
      return;
    }
    drawTrunks(parent, L, pos);
  }

  function drawTrunks(parent, L, pos) {
    const first = pos.get(L.spines[0].name);
    const last = pos.get(L.spines[L.spines.length - 1].name);
    const busY = first.y + 12;
    line(parent, { x: first.x, y: busY }, { x: last.x, y: busY }, "cable bus");
    for (const sp of L.spines) {
      const p = pos.get(sp.name);
      line(parent, { x: p.x, y: p.y }, { x: p.x, y: busY }, cableClass(sp));
    }
    L.blocks.forEach((b, i) => {
      const o = blockOrigin(L, i);
      const chX = o.x - L.blockGap / 2;
      const hot = b.leaves.find((lf) => (lf.root_cause_of || []).length);
      const cls = cableClass(hot) + " trunk";
      const pts = [chX, busY, chX, o.y + 9, o.x, o.y + 9].join(" ");
      parent.append(svg("polyline", { class: cls, points: pts }));
    });
  }

  /** Leaf-spine cables as the probe mesh sees them: loss and delay as colour (ok, warn, bad). */
  function drawProbeLinks(parent, probes, pos) {
    for (const p of probes) {
      const a = pos.get(p.a);
      const b = pos.get(p.b);
      if (!a || !b || p.level === "ok") continue;
      const g = svg("g", { class: "probe pl-" + p.level, "data-name": p.name });
      const ln = svg("line", { x1: a.box.x + a.box.w / 2, y1: a.box.y + a.box.h / 2, x2: b.box.x + b.box.w / 2, y2: b.box.y + b.box.h / 2 });
      const title = svg("title", {});
      title.textContent = p.name + ": loss " + (100 * p.loss).toFixed(2) + "%, p99 " + Math.round(p.p99_us) + " us (probes)";
      ln.append(title);
      g.append(ln);
      parent.append(g);
    }
  }

  /** Cables that are themselves the root cause of an incident, drawn on top and linked. */
  function drawFaultyLinks(parent, links, pos) {
    for (const link of links) {
      const a = pos.get(link.a);
      const b = pos.get(link.b);
      if (!a || !b) continue;
      const g = svg("g", {
        class: "link fault st-" + link.status,
        "data-name": link.name,
        "data-incident": link.incident,
        "data-incidents": link.incident,
      });
      const anchor = svg("a", { href: "#incident-" + link.incident });
      anchor.append(svg("line", { x1: a.box.x + a.box.w / 2, y1: a.box.y + a.box.h / 2, x2: b.box.x + b.box.w / 2, y2: b.box.y + b.box.h / 2 }));
      g.append(anchor);
      parent.append(g);
    }
  }

  // -- tooltip ------------------------------------------------------------------------------

  function findItem(name) {
    const f = state.fabric;
    if (!f) return null;
    for (const sp of f.spines) if (sp.name === name) return sp;
    for (const b of f.blocks) {
      for (const lf of b.leaves) if (lf.name === name) return lf;
      for (const n of b.nodes) if (n.name === name) return n;
    }
    for (const n of f.nodes) if (n.name === name) return n;
    for (const l of f.links) if (l.name === name) return { name: l.name, status: l.status, root_cause_of: [l.incident] };
    return null;
  }

  function tooltipContent(item) {
    const parts = [el("div", { class: "tt-name", text: item.name })];
    const facts = [];
    if (item.spare) facts.push("spare");
    if (item.state) facts.push(item.state === "unknown" ? "never seen" : item.state);
    if (item.last_seen_ms) facts.push("seen " + fmtAgo(item.last_seen_ms));
    facts.push("status " + (item.status || "ok"));
    parts.push(el("div", { class: "tt-row", text: facts.join(" · ") }));
    if ((item.parts || []).length) parts.push(el("div", { class: "tt-row", text: "faulty: " + item.parts.join(", ") }));
    for (const [role, ids] of [["root cause of", item.root_cause_of || []], ["affected by", item.affected_by || []]]) {
      for (const id of ids) {
        const inc = state.byId.get(id);
        const what = inc ? inc.kind + " (" + inc.severity + ")" + (inc.root_cause ? " on " + inc.root_cause : "") : "";
        parts.push(el("div", { class: "tt-inc", text: role + " " + id + ": " + what }));
      }
    }
    return parts;
  }

  function onFabricHover(ev) {
    const tip = $("tooltip");
    const target = ev.target.closest ? ev.target.closest("[data-name]") : null;
    const item = target ? findItem(target.dataset.name) : null;
    if (!item) {
      tip.hidden = true;
      return;
    }
    tip.replaceChildren(...tooltipContent(item));
    tip.hidden = false;
    const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = Math.min(ev.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }

  function highlight(id, on) {
    for (const node of document.querySelectorAll('[data-incidents~="' + CSS.escape(id) + '"]')) {
      node.classList.toggle("hl", on);
    }
  }

  // -- incidents ----------------------------------------------------------------------------

  function renderIncidents(incidents) {
    const open = incidents.filter((i) => i.open);
    const resolved = incidents.filter((i) => !i.open).slice(0, 50);
    $("incidents").replaceChildren(...open.map(incidentItem));
    $("incidents-empty").hidden = open.length > 0;
    $("incidents-meta").textContent = open.length + " open";
    $("resolved").replaceChildren(...resolved.map(incidentItem));
    $("resolved-empty").hidden = resolved.length > 0;
    $("resolved-meta").textContent = resolved.length ? "last " + resolved.length : "";
    if (location.hash.startsWith("#incident-")) {
      const target = document.getElementById(location.hash.slice(1));
      if (target) target.classList.add("hl");
    }
  }

  function incidentItem(inc) {
    const cls = "incident sev-" + inc.severity + (inc.open ? " open" : " resolved");
    const li = el("li", { id: "incident-" + inc.id, class: cls, "data-incident": inc.id, "data-kind": inc.kind });
    const when = inc.open
      ? fmtClock(inc.opened_ms) + " · " + fmtAgo(inc.opened_ms)
      : fmtClock(inc.opened_ms) + " → " + fmtClock(inc.resolved_ms) + " (" + fmtDuration(inc.resolved_ms - inc.opened_ms) + ")";
    li.append(
      el(
        "div",
        { class: "inc-head" },
        el("span", { class: "sev sev-" + inc.severity + (inc.open ? "" : " resolved"), text: inc.open ? inc.severity : "resolved" }),
        el("span", { class: "kind", text: inc.kind }),
        el("span", { class: "rc", text: inc.root_cause || "(network)" }),
        el("time", { datetime: new Date(inc.opened_ms).toISOString(), text: when }),
      ),
      el(
        "div",
        { class: "inc-body" },
        "action ",
        el("span", { class: "action", text: inc.action }),
        " · " + inc.affected_nodes.length + " node" + (inc.affected_nodes.length === 1 ? "" : "s") + ": ",
        el("span", { class: "nodes", text: listNodes(inc.affected_nodes, 6) || "–" }),
        inc.affected_jobs.length ? " · jobs " + inc.affected_jobs.join(", ") : null,
        " · " + inc.id,
      ),
      evidenceBlock(inc.evidence || []),
    );
    li.addEventListener("mouseenter", () => highlight(inc.id, true));
    li.addEventListener("mouseleave", () => highlight(inc.id, false));
    return li;
  }

  function evidenceBlock(evidence) {
    if (!evidence.length) return null;
    const items = evidence.slice(0, 20).map((e) =>
      el("li", {}, el("code", { text: e.component || "" }), " " + (e.message || e.rule || "") + (e.count > 1 ? " ×" + e.count : "")),
    );
    if (evidence.length > 20) items.push(el("li", { text: "+" + (evidence.length - 20) + " more" }));
    return el("details", {}, el("summary", { text: "evidence (" + evidence.length + ")" }), el("ul", {}, ...items));
  }

  // -- nodes table --------------------------------------------------------------------------

  function nodeRows() {
    const marks = new Map();
    const f = state.fabric;
    if (f) {
      for (const b of f.blocks) for (const n of b.nodes) marks.set(n.name, n);
      for (const n of f.nodes) marks.set(n.name, n);
    }
    const rows = new Map();
    for (const n of state.nodes) {
      if (n.role === "NODE_ROLE_SWITCH") continue;
      rows.set(n.node_id, {
        name: n.node_id,
        state: n.state,
        lifecycle: n.lifecycle_state || "in_service",
        lifecycleSince: Number(n.lifecycle_since_ms || 0),
        lifecycleReason: n.lifecycle_reason || "",
        last_seen_ms: Number(n.last_seen_ms || 0),
        gpus: n.gpu_count || 0,
        nics: n.nic_count || 0,
        events: n.open_events || 0,
      });
    }
    for (const [name, m] of marks) {
      if (!rows.has(name)) {
        rows.set(name, {
          name, state: "unknown", lifecycle: lifecycleOf(m) || "in_service", lifecycleSince: Number(m.lifecycle_since_ms || 0),
          lifecycleReason: m.lifecycle_reason || "", last_seen_ms: 0, gpus: "", nics: "", events: "",
        });
      }
    }
    const list = Array.from(rows.values()).map((r) => Object.assign(r, { mark: marks.get(r.name) || {} }));
    list.sort((a, b) => rank(b) - rank(a) || a.name.localeCompare(b.name));
    return list;
  }

  function rank(row) {
    const sev = incidentsOf(row.mark).length ? SEVERITY_RANK[row.mark.status] + 2 : 0;
    return (row.state === "unreachable" ? 10 : 0) + (row.lifecycle !== "in_service" ? 5 : 0) + sev;
  }

  function renderNodes() {
    const filter = $("node-filter").value.trim().toLowerCase();
    const rows = nodeRows();
    const shown = filter ? rows.filter((r) => (r.name + " " + r.state + " " + r.lifecycle).toLowerCase().includes(filter)) : rows;
    $("nodes").tBodies[0].replaceChildren(...shown.map(nodeRow));
    const bad = rows.filter((r) => r.state === "unreachable").length;
    $("nodes-meta").textContent = rows.length + " nodes" + (bad ? " · " + bad + " unreachable" : "");
  }

  function nodeRow(r) {
    const ids = incidentsOf(r.mark);
    const cls = [r.state, "life-" + r.lifecycle, ids.length ? "has-incident st-" + r.mark.status : ""].join(" ").trim();
    const why = r.lifecycleReason + (r.lifecycleSince ? " (since " + fmtAgo(r.lifecycleSince) + ")" : "");
    const links = ids.map((id) => el("a", { href: "#incident-" + id, text: id }));
    const incCell = el("td", {});
    links.forEach((a, i) => incCell.append(i ? ", " : "", a));
    return el(
      "tr",
      { id: "row-" + r.name, class: cls, "data-node": r.name },
      el("td", { text: r.name }),
      el("td", {}, el("span", { class: "state " + r.state, text: r.state })),
      el("td", { title: why }, el("span", { class: "life life-" + r.lifecycle, text: r.lifecycle.replace("_", " ") })),
      el("td", { title: r.last_seen_ms ? new Date(r.last_seen_ms).toISOString() : "", text: fmtAgo(r.last_seen_ms) }),
      el("td", { class: "num", text: r.gpus }),
      el("td", { class: "num", text: r.nics }),
      el("td", { class: "num", text: r.events }),
      incCell,
    );
  }

  // -- node search ---------------------------------------------------------------------------

  /** Every node name the page knows (fabric and registry), sorted. */
  function allNodeNames() {
    const names = new Set(state.nodes.filter((n) => n.role !== "NODE_ROLE_SWITCH").map((n) => n.node_id));
    const f = state.fabric;
    if (f) {
      for (const b of f.blocks) for (const n of b.nodes) names.add(n.name);
      for (const n of f.nodes) names.add(n.name);
    }
    return Array.from(names).sort();
  }

  function renderNodeNames() {
    const names = allNodeNames();
    const list = $("node-names");
    if (list.childElementCount === names.length) return;
    list.replaceChildren(...names.map((n) => el("option", { value: n })));
  }

  /** The node a search means: the exact name, else the only (or first) name containing it. */
  function findNode(query) {
    const q = query.trim().toLowerCase();
    if (!q) return null;
    const names = allNodeNames();
    return names.find((n) => n.toLowerCase() === q) || names.find((n) => n.toLowerCase().includes(q)) || null;
  }

  function onSearch(ev) {
    ev.preventDefault();
    const input = $("node-search");
    const name = findNode(input.value);
    input.classList.toggle("miss", !name);
    input.title = name ? "" : "no node matches " + JSON.stringify(input.value);
    if (name) location.hash = "#node/" + encodeURIComponent(name);
  }

  // -- live updates -------------------------------------------------------------------------

  function startPolling() {
    if (state.pollTimer === null) state.pollTimer = setInterval(refresh, POLL_MS);
  }

  function stopPolling() {
    if (state.pollTimer !== null) clearInterval(state.pollTimer);
    state.pollTimer = null;
  }

  function startStream() {
    if (!window.EventSource) {
      setMode("polling");
      startPolling();
      return;
    }
    const es = new EventSource("/api/stream");
    es.addEventListener("open", () => {
      setMode("live");
      stopPolling();
    });
    es.addEventListener("changed", (ev) => {
      const version = JSON.parse(ev.data).version;
      if (version !== state.version) {
        state.version = version;
        refresh();
      }
    });
    es.addEventListener("error", () => {
      if (state.mode !== "offline") setMode("polling");
      startPolling(); // EventSource reconnects by itself; "open" stops the polling again
    });
  }

  function debounce(fn, ms) {
    let timer = null;
    return () => {
      clearTimeout(timer);
      timer = setTimeout(fn, ms);
    };
  }

  function init() {
    $("fabric-svg").addEventListener("mousemove", onFabricHover);
    $("fabric-svg").addEventListener("mouseleave", () => ($("tooltip").hidden = true));
    $("node-filter").addEventListener("input", renderNodes);
    $("node-search-form").addEventListener("submit", onSearch);
    window.addEventListener("resize", debounce(() => renderFabric(state.fabric), 150));
    window.addEventListener("hashchange", () => {
      for (const node of document.querySelectorAll(".incident.hl")) node.classList.remove("hl");
      renderIncidents(state.incidents);
      sp.views.showView();
    });
    const data = embedded();
    if (data) {
      apply(data); // a snapshot: drawn now, while the document loads, with no fetch to wait for
      render();
      sp.views.loadExtras(); // jobs and events are not embedded
    } else {
      refresh();
    }
    sp.views.showView();
    if (isSnapshot()) {
      setMode("snapshot");
      return;
    }
    setInterval(refresh, REFRESH_MS);
    startStream();
  }

  /** ``?live=0``: render once, no event stream or polling (screenshots, headless checks, reports). */
  function isSnapshot() {
    return new URLSearchParams(location.search).get("live") === "0";
  }

  document.addEventListener("DOMContentLoaded", init);
})();
