(() => {
  "use strict";
  // The data: see memlayout/report/html.py (side_data) for the row layouts.
  const DATA = JSON.parse(document.getElementById("memlayout-data").textContent);
  const SHOWN_FRACTION = 0.01; // storages of at least 1% of the largest get their own row...
  const MAX_SINGLE = 200;      // ...up to this many; the rest are grouped by size, collapsed
  const BATCH = 100;           // rows drawn per step, as the reader scrolls
  const CLUSTER_BELOW = 0.15;  // segments narrower than this % of their bar merge into one
  const MAX_LANES = 4;         // overlapping segments stack in lanes
  const LANE = 16;
  const HIGHLIGHT_LIMIT = 5000;
  const tip = document.getElementById("tip");

  // memlayout/format_bytes.py's human_bytes, in the same integer arithmetic, so a
  // count reads the same here as in the table (toFixed would round 539.25 up where
  // Python rounds it to even). Exact while count * 10 stays below 2**53 (800 TiB).
  const bytes = (n) => {
    if (Math.abs(n) < 1024) return n + " B";
    const sign = n < 0 ? "-" : "", magnitude = Math.abs(n);
    for (const [unit, scale] of [["KiB", 1024], ["MiB", 1048576], ["GiB", 1073741824]]) {
      const tenths = Math.floor((magnitude * 10 + scale / 2) / scale);
      if (tenths < 10240 || unit === "GiB") return sign + Math.floor(tenths / 10) + "." + (tenths % 10) + " " + unit;
    }
  };
  const pushTo = (map, key, value) => { let list = map.get(key); if (!list) map.set(key, list = []); list.push(value); };
  const el = (tag, cls, parent) => { const e = document.createElement(tag); if (cls) e.className = cls; if (parent) parent.appendChild(e); return e; };

  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) if (entry.isIntersecting) drawMore(entry.target._list, BATCH);
  }, { rootMargin: "600px" });

  const sides = DATA.sides.map((side, index) => {
    const members = side.storages.map(() => []);
    side.tensors.forEach((t, i) => members[t[7]].push(i));
    for (const list of members) list.sort((a, b) => side.tensors[a][5] - side.tensors[b][5] || side.tensors[b][6] - side.tensors[a][6]);
    const adj = new Map();
    for (const [a, b, rel] of side.links) { pushTo(adj, a, [b, rel]); pushTo(adj, b, [a, rel]); }
    const byKey = new Map();
    side.tensors.forEach((t, i) => { for (const key of t[9]) pushTo(byKey, key, i); });
    return { side, index, members, adj, byKey, elements: new Map(), listOf: [], groups: [],
             container: document.querySelector(`.map[data-side="${index}"]`) };
  });

  function makeList(P, parent, items, scale) {
    const list = { P, parent, items, scale, drawn: 0, sentinel: null };
    items.forEach((storage, position) => { P.listOf[storage] = { list, position }; });
    return list;
  }

  function drawMore(list, count) {
    const end = Math.min(list.items.length, list.drawn + count);
    const fragment = document.createDocumentFragment();
    for (let i = list.drawn; i < end; i++) fragment.appendChild(drawStorage(list.P, list.items[i], list.scale));
    list.drawn = end;
    if (list.sentinel) { observer.unobserve(list.sentinel); list.sentinel.remove(); list.sentinel = null; }
    list.parent.appendChild(fragment);
    if (list.drawn < list.items.length) {
      const more = el("div", "more", list.parent);
      more.textContent = `${list.items.length - list.drawn} more storages (scroll to draw)`;
      more._list = list;
      list.sentinel = more;
      observer.observe(more);
    }
  }

  function drawStorage(P, si, scale) {
    const [id, device, nbytes, used, padding, unused, gaps, overlaps] = P.side.storages[si];
    const members = P.members[si];
    const row = el("div", "storage");
    row.dataset.storage = id;
    row.dataset.segments = members.length;
    const label = el("div", "label", row);
    label.innerHTML = "<b></b>";
    label.firstChild.textContent = id;
    label.append(` ${device} \u00b7 ${bytes(nbytes)} \u00b7 used ${bytes(used)}` +
      (unused ? ` \u00b7 unused ${bytes(unused)}` : "") + (padding ? ` \u00b7 padding ${bytes(padding)}` : "") +
      ` \u00b7 ${members.length} tensor${members.length === 1 ? "" : "s"}`);
    const bar = el("div", "bar", el("div", "track", row));
    bar.style.width = Math.max(nbytes / scale * 100, 0.3) + "%";
    bar._fraction = nbytes / scale;
    const pct = (x) => nbytes ? (x / nbytes * 100) : 0;
    // Gaps too thin to see (the padding after each slot of a flat buffer of 100,000
    // tensors) merge into runs, as thin segments merge into clusters: one element
    // per visible run, not one per gap.
    let run = null;
    const drawRun = () => {
      if (!run) return;
      const gap = el("div", run.padding ? "gap padding" : "gap unused", bar);
      gap.style.left = pct(run.start) + "%";
      gap.style.width = pct(run.end - run.start) + "%";
      run = null;
    };
    for (const [start, end, isPadding] of gaps) {
      const thin = pct(end - start) < CLUSTER_BELOW;
      if (run && thin && run.padding === isPadding && pct(start - run.end) < CLUSTER_BELOW) { run.end = end; continue; }
      drawRun();
      run = { start, end, padding: isPadding };
      if (!thin) drawRun();
    }
    drawRun();
    for (const [start, end] of overlaps) {
      const overlap = el("div", "overlap", bar);
      overlap.style.left = pct(start) + "%";
      overlap.style.width = pct(end - start) + "%";
    }
    const laneEnds = [];
    let pending = null;
    const flush = () => {
      if (!pending) return;
      if (pending.ts.length === 1) placeSegment(P, bar, pending.ts, pending.lane, pct(pending.start), pct(pending.end - pending.start));
      else placeSegment(P, bar, pending.ts, pending.lane, pct(pending.start), Math.max(pct(pending.end - pending.start), CLUSTER_BELOW));
      pending = null;
    };
    for (const t of members) {
      const tensor = P.side.tensors[t];
      const start = tensor[5], end = tensor[6];
      let lane = laneEnds.findIndex((laneEnd) => laneEnd <= start);
      if (lane < 0) lane = laneEnds.length < MAX_LANES ? laneEnds.length : MAX_LANES - 1;
      laneEnds[lane] = Math.max(laneEnds[lane] || 0, end);
      const width = pct(end - start);
      if (width < CLUSTER_BELOW) {
        if (pending && pending.lane === lane && pct(start - pending.end) < CLUSTER_BELOW) {
          pending.ts.push(t);
          pending.end = Math.max(pending.end, end);
          continue;
        }
        flush();
        pending = { lane, start, end, ts: [t] };
        continue;
      }
      if (pending && pending.lane === lane) flush();
      placeSegment(P, bar, [t], lane, pct(start), width);
    }
    flush();
    bar.style.height = (Math.max(laneEnds.length, 1) * LANE + 2) + "px";
    return row;
  }

  // A tie: one tensor under several names, or a view over exactly the bytes of another.
  const isTied = (P, t) => P.side.tensors[t][0].length > 1 || (P.adj.get(t) || []).some(([, rel]) => rel === "equal");

  function placeSegment(P, bar, ts, lane, left, width) {
    const seg = el("div", "seg", bar);
    if (ts.length > 1) { seg.classList.add("cluster"); seg.dataset.ts = ts.join(","); }
    else seg.dataset.t = ts[0];
    const marks = ts.map((t) => P.side.tensors[t][10]).filter(Boolean);
    if (marks.length) seg.classList.add("mark-" + marks[0]);
    else if (ts.some((t) => isTied(P, t))) seg.classList.add("tied");
    seg.style.left = left + "%";
    seg.style.width = width + "%";
    // Wide segments carry their names (every name of a tie), so the map reads without hovering.
    if (width * bar._fraction > 12) seg.textContent = ts.length > 1 ? `${ts.length} tensors` : P.side.tensors[ts[0]][0].join(" = ");
    seg.style.top = (lane * LANE + 1) + "px";
    for (const t of ts) pushTo(P.elements, t, seg);
  }

  function layout(P) {
    const storages = P.side.storages;
    const largest = storages.length ? storages[0][2] : 1;
    let single = 0;
    while (single < storages.length && single < MAX_SINGLE && (single === 0 || storages[single][2] >= largest * SHOWN_FRACTION)) single++;
    const singles = [];
    for (let i = 0; i < single; i++) singles.push(i);
    const main = el("div", "rows", P.container);
    drawMore(makeList(P, main, singles, Math.max(largest, 1)), BATCH);
    // The rest, by size in powers of 4: legible bars (each group is scaled to its own
    // largest storage) and nothing drawn until a group is opened.
    const buckets = new Map();
    for (let i = single; i < storages.length; i++) pushTo(buckets, Math.floor(Math.log2(Math.max(storages[i][2], 1)) / 2), i);
    for (const [bucket, items] of buckets) {
      const group = el("div", "group", P.container);
      const head = el("div", "group-head", group);
      const total = items.reduce((sum, i) => sum + storages[i][2], 0);
      head.textContent = `${items.length} storage${items.length === 1 ? "" : "s"} of ${bytes(4 ** bucket)} to ${bytes(4 ** (bucket + 1))} ` +
        `(${bytes(total)} in all; drawn at their own scale, x${Math.max(1, Math.round(largest / Math.max(storages[items[0]][2], 1)))})`;
      const body = el("div", "group-body", group);
      const entry = { group, body, items, list: null };
      items.forEach((storage, position) => { P.listOf[storage] = { entry, position }; });
      head.addEventListener("click", () => toggleGroup(P, entry));
      P.groups.push(entry);
    }
  }

  function openGroup(P, entry) {
    entry.group.classList.add("open");
    if (!entry.list) {
      entry.list = makeList(P, entry.body, entry.items, Math.max(P.side.storages[entry.items[0]][2], 1));
      drawMore(entry.list, BATCH);
    }
    entry.body.hidden = false;
  }

  function toggleGroup(P, entry) {
    if (entry.group.classList.contains("open") && entry.list) {
      entry.group.classList.remove("open");
      entry.body.hidden = true;
    } else openGroup(P, entry);
  }

  function ensureDrawn(P, t) {
    const storage = P.side.tensors[t][7];
    let place = P.listOf[storage];
    if (place.entry) { openGroup(P, place.entry); place = P.listOf[storage]; }
    if (place.list.drawn <= place.position) drawMore(place.list, place.position + 1 - place.list.drawn + BATCH);
  }

  // Hover: the tooltip, and every segment tied or aliased to this one lit up (the
  // same tensor on the other side of a diff too).
  let lit = [];
  const light = (elements, cls) => { for (const e of elements || []) { e.classList.add(cls); lit.push([e, cls]); } };

  function describe(P, t) {
    const [names, dtype, shape, stride, offset, start, end, storage, kind, , mark] = P.side.tensors[t];
    const [id, device] = P.side.storages[storage];
    const lines = [names.join("\n  = "), `${dtype}[${shape.join(", ")}]  stride [${stride.join(", ")}]  ${kind}`,
      `offset ${offset} elements; bytes ${start}..${end} (${bytes(end - start)})`, `storage ${id} on ${device}`];
    for (const [other, rel] of P.adj.get(t) || []) lines.push(`${rel}: ${P.side.tensors[other][0][0]}`);
    if (mark) lines.push(`diff: ${mark}`);
    return lines.join("\n");
  }

  function enter(seg) {
    const P = sides[Number(seg.closest(".map").dataset.side)];
    const ts = seg.dataset.ts ? seg.dataset.ts.split(",").map(Number) : [Number(seg.dataset.t)];
    leave();
    light([seg], "hover");
    for (const t of ts.slice(0, 50)) {
      for (const [other] of P.adj.get(t) || []) light(P.elements.get(other), "linked");
      for (const Q of sides) {
        if (Q === P) continue;
        for (const key of P.side.tensors[t][9]) for (const other of Q.byKey.get(key) || []) light(Q.elements.get(other), "linked");
      }
    }
    tip.textContent = ts.length === 1 ? describe(P, ts[0])
      : `${ts.length} small tensors\n` + ts.slice(0, 12).map((t) => P.side.tensors[t][0][0]).join("\n") + (ts.length > 12 ? "\n..." : "");
    tip.hidden = false;
  }

  function leave() {
    for (const [e, cls] of lit) e.classList.remove(cls);
    lit = [];
    tip.hidden = true;
  }

  document.addEventListener("mouseover", (event) => {
    const seg = event.target.closest && event.target.closest(".seg");
    if (seg) enter(seg); else if (lit.length) leave();
  });
  document.addEventListener("mousemove", (event) => {
    if (tip.hidden) return;
    const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
    const y = event.clientY + 18 + tip.offsetHeight > window.innerHeight ? event.clientY - tip.offsetHeight - 10 : event.clientY + 18;
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  });

  // Click a finding (or a change): its tensors are highlighted, drawn first if needed.
  let active = null;
  function highlight(item, perSide) {
    for (const e of document.querySelectorAll(".seg.hl")) e.classList.remove("hl");
    if (active) active.classList.remove("active");
    if (active === item) { active = null; document.body.dataset.highlighted = "0"; return; }
    active = item;
    item.classList.add("active");
    let count = 0, first = null;
    perSide.forEach((ts, s) => {
      const P = sides[s];
      for (const t of ts.slice(0, HIGHLIGHT_LIMIT)) {
        ensureDrawn(P, t);
        for (const e of P.elements.get(t) || []) { e.classList.add("hl"); first = first || e; }
        count++;
      }
    });
    document.body.dataset.highlighted = String(count);
    if (first) first.scrollIntoView({ block: "center" });
  }

  document.addEventListener("click", (event) => {
    const item = event.target.closest && event.target.closest(".item");
    if (!item) return;
    if (item.dataset.finding !== undefined) {
      const s = Number(item.dataset.side);
      const perSide = sides.map(() => []);
      perSide[s] = sides[s].side.findings[Number(item.dataset.finding)][5];
      highlight(item, perSide);
    } else if (item.dataset.change !== undefined) {
      const line = DATA.changes[Number(item.dataset.change)];
      highlight(item, [line[3], line[4]]);
    }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && event.target.classList && event.target.classList.contains("item")) event.target.click();
  });

  for (const P of sides) layout(P);
  requestAnimationFrame(() => requestAnimationFrame(() => {
    window.memlayoutReady = performance.now();
    document.body.dataset.ready = "1";
  }));
})();
