"""The timeline's browser code (BokehJS `CustomJS` bodies), kept apart from the Python that builds the figure.

Every surface runs the same code: the static report, a notebook (jupyter_bokeh) and the Lab panel. What
differs is only where new spans come from: the panel installs `remote._wb_api` (the server's `spans`,
`search`, `aggregate` and `events` routes, called with Jupyter's auth), a notebook's kernel writes a
`window` reply into `remote.tags` itself (`workbench.ui.live`), and a report has neither and keeps what
it embeds. A reply of the `spans` route (docs/api-spans.md) is applied by `APPLY_REPLY`, whoever fetched it.
"""

from __future__ import annotations

from bokeh.models import CustomJSHover

FORMAT = """
const fmt_num = (v) => v.toLocaleString("en-US", {maximumFractionDigits: 3});
const fmt_time = (ns) => {
  if (ns == null || !isFinite(ns)) return "\u2014";
  const a = Math.abs(ns);
  const [scale, unit] = a >= 1e9 ? [1e9, "s"] : a >= 1e6 ? [1e6, "ms"] : a >= 1e3 ? [1e3, "\u00b5s"] : [1, "ns"];
  return `${fmt_num(ns / scale)} ${unit}`;
};
const fmt_count = (n) => (n == null || !isFinite(n)) ? "\u2014" : Math.round(n).toLocaleString("en-US");
const fmt_si = (v, unit) => {
  if (v == null || !isFinite(v)) return "\u2014";
  const prefix = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]].find(([s]) => Math.abs(v) >= s);
  return prefix ? `${fmt_num(v / prefix[0])} ${prefix[1]}${unit}` : `${fmt_num(v)} ${unit}`;
};
"""
"""Readable numbers: a unit on every time and size, integers for counts, an em dash for a missing value."""

JUMP = """
const jump = (xr, source, start, dur) => {
  const len = Math.max(dur, 1), end = start + len, center = (start + end) / 2;
  let width = xr.end - xr.start;
  if (len > 0.8 * width) width = len * 1.25;
  else if (len < width / 2000) width = len * 50;  // too narrow to see at this zoom: zoom in on it
  const tags = source.tags;
  if (remote._wb_api == null) {  // no server: stay inside the embedded window that holds it
    for (let k = 0; k + 1 < tags.length; k += 2)
      if (start >= tags[k] && end <= tags[k + 1]) {
        width = 2 * Math.min(width / 2, center - tags[k], tags[k + 1] - center);
        break;
      }
  }
  xr.setv({start: center - width / 2, end: center + width / 2});
};
"""
"""`jump(xr, source, start, dur)`: center the view on an event, zooming in when it would be too narrow to see."""

LOD = """
const x0 = Math.max(xr.start, extent[0]), x1 = Math.min(xr.end, extent[1]);
const tags = source.tags;
let inside = false;
for (let k = 0; k + 1 < tags.length; k += 2) if (x0 >= tags[k] && x1 <= tags[k + 1]) { inside = true; break; }
const live = remote._wb_api != null;
for (const r of spans) r.visible = inside;
remote_bars.visible = inside;
boxes.visible = !inside && tags.length >= 2 && !live;
const fmt = (ns) => (ns / 1e6).toFixed(3) + " ms";
if (inside) {
  const left = source.data.left, right = source.data.right;
  let n = 0;
  for (let i = 0; i < left.length; i++) if (left[i] <= x1 && right[i] >= x0) n++;
  const dense = new Set(remote_bars.data_source.data.y).size;
  status.text = `${n.toLocaleString()} spans in view` + (dense ? `; ${dense} busy lanes as density (zoom in)` : "");
  for (const r of levels) r.visible = false;
  return;
}
if (remote._wb_expanded != null) {  // the precomputed levels know the figure's own lanes only
  for (const r of levels) r.visible = false;
  status.text = "fetching the spans of this window";
  return;
}
const px = (xr.end - xr.start) / Math.max(plot.inner_width || width, 1);
let level = levels.length - 1;
for (let l = 0; l < levels.length; l++) if (bin_ns[l] <= px) { level = l; break; }
levels.forEach((r, l) => { r.visible = l == level; });
const data = levels[level].data_source.data, x = data.x, count = data.count, half = bin_ns[level] / 2;
let n = 0, m = 0;
for (let i = 0; i < x.length; i++) if (x[i] + half > x0 && x[i] - half < x1) { n += count[i]; m++; }
const where = live ? " (fetching the spans of this window)"
  : tags.length == 2 ? ` (real spans embedded for ${fmt(tags[0])} to ${fmt(tags[1])}, the dashed box)`
  : tags.length > 2 ? ` (real spans embedded in ${tags.length / 2} windows, the dashed boxes: jump to one below)` : "";
status.text = `aggregated: ${n.toLocaleString()} events in ${m.toLocaleString()} bins \u2014 zoom in for spans` + where;
"""
"""Level of detail: real spans while the view lies inside a window they cover (`source.tags`: start, end pairs),
else the density level whose bins are no wider than a pixel."""

LABELS = """
const data = source.data, left = data.left, right = data.right, y = data.y, name = data.name, kind = data.kind;
const out = {x: [], y: [], text: [], color: []};
if (bars.visible) {
  const x0 = xr.start, x1 = xr.end, scale = Math.max(plot.inner_width || width, 1) / Math.max(x1 - x0, 1);
  for (let i = 0; i < left.length && out.x.length < max_labels; i++) {
    if (right[i] <= x0 || left[i] >= x1) continue;
    const a = Math.max(left[i], x0), b = Math.min(right[i], x1), room = Math.floor(((b - a) * scale - pad) / char_px);
    if (room < 5) continue;
    const text = name[i].length <= room ? name[i] : name[i].slice(0, room - 1) + "\u2026";
    out.x.push((a + b) / 2); out.y.push(y[i]); out.text.push(text); out.color.push(ink[kind[i]] ?? "white");
  }
}
labels.data = out;
"""
"""Names drawn inside the spans wide enough to hold at least three characters (cut with an ellipsis)."""

KEYS = """
const state = plot._wb_keys ?? (plot._wb_keys = {over: false, x: null});
if (cb_obj.event_name == "mouseenter") state.over = true;
if (cb_obj.event_name == "mouseleave") state.over = false;
if (cb_obj.x != null && isFinite(cb_obj.x)) state.x = cb_obj.x;
if (state.installed) return;
state.installed = true;
window.addEventListener("keydown", (event) => {
  const key = event.key.toLowerCase();
  if (!state.over || event.ctrlKey || event.metaKey || event.altKey || !["w", "a", "s", "d"].includes(key)) return;
  const target = event.composedPath()[0];
  if (target && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName))) return;
  event.preventDefault();
  event.stopPropagation();
  let start = xr.start, end = xr.end;
  const width = end - start;
  if (key == "w" || key == "s") {
    const factor = key == "w" ? 0.8 : 1.25;
    const at = state.x != null && state.x >= start && state.x <= end ? state.x : (start + end) / 2;
    start = at - (at - start) * factor;
    end = at + (end - at) * factor;
  } else {
    const shift = (key == "a" ? -0.2 : 0.2) * width;
    start += shift;
    end += shift;
  }
  const bounds = xr.bounds;
  if (bounds != null) {
    if (start < bounds[0]) { end += bounds[0] - start; start = bounds[0]; }
    if (end > bounds[1]) { start -= end - bounds[1]; end = bounds[1]; }
    start = Math.max(start, bounds[0]);
  }
  xr.setv({start, end});
}, true);
"""
"""Perfetto's keys while the pointer is over the plot: W/S zoom in/out around the pointer, A/D pan."""

KEEP_ACTIVE = """
if (!cb_obj.active && !others.some((tool) => tool.active)) cb_obj.active = true;
"""
"""A click on the active pan or wheel-zoom button does not leave the plot without one (another drag tool may
take pan's place)."""

REQUEST = """
const api = remote._wb_api;
if (api == null) return;
remote._wb_fetch = (force) => {
  const start = Math.floor(xr.start), end = Math.ceil(xr.end), width = end - start;
  if (!(width > 0)) return;
  const tags = source.tags;
  if (!force && tags.length == 2 && start >= tags[0] && end <= tags[1]
      && (remote._wb_complete || tags[1] - tags[0] <= 3 * width))
    return;  // what is shown covers the view at this zoom
  const px = Math.max(1, Math.round(plot.inner_width || plot_width));
  const id = (remote._wb_request ?? 0) + 1;
  remote._wb_request = id;
  api.spans(start - Math.floor(width / 2), end + Math.ceil(width / 2), Math.min(2 * px, 20000), remote._wb_expand)
    .then((reply) => {
      if (id != remote._wb_request) return;
      remote._wb_complete = reply.lanes.every((lane) => lane.mode == "spans");
      remote.tags = [reply];
    }).catch((error) => { status.text = `could not fetch the spans of this window: ${error.message ?? error}`; });
};
clearTimeout(remote._wb_timer);
remote._wb_timer = setTimeout(() => remote._wb_fetch(false), 200);
"""
"""In the Lab panel: once the x-range settles, ask the server for the spans of the view (and half a view on
each side, so small pans need nothing new), with the lane expansion chosen (`remote._wb_expand`, see
`EXPAND`); `remote._wb_fetch(true)` asks again at once."""

APPLY_REPLY = """
const reply = remote.tags[0];
if (reply == null || reply.lanes == null) return;
const names = reply.names, kinds = reply.kinds;
const old = source.data, kept = new Set(source.selected.indices.map((i) => old.row[i]));
const cols = {left: [], right: [], y: [], lane: [], depth: [], instant_px: [], dur_ns: [], name: [], kind: [],
              shapes: [], flops: [], row: [], launcher_idx: [], launcher_name: [], launched: [], parent_idx: []};
const launcher = [];
const bars = {x: [], w: [], y: [], h: [], alpha: [], kind_id: [], name: [], count: [], busy: []};
let tops = lane_top, heights = lane_rows;
if (reply.expanded != null || remote._wb_expanded != null) {
  // an expanded lane adds lanes: lay the reply's out as the figure was (views.timeline._lane_layout), or back
  const saved = remote._wb_layout ?? (remote._wb_layout = {ticks: [...yaxis.ticker.ticks],
    labels: new Map(yaxis.major_label_overrides), start: plot.y_range.start, height: plot.height});
  if (reply.expanded != null) {
    tops = {}; heights = {};
    const ticks = [], labels = new Map();
    let y = 0, device = null;
    reply.lanes.forEach((lane, i) => {
      if (i > 0) y += lane.device != device ? 2 * lane_gap : lane_gap;
      device = lane.device;
      tops[lane.lane] = y; heights[lane.lane] = lane.rows;
      const center = y + lane.rows / 2;
      ticks.push(center);
      labels.set(center, lane.parent != null || lane.lane == reply.expanded.lane ? `${lane.device} \u00b7 ${lane.label}`
        : lane_text[lane.lane]);
      y += lane.rows;
    });
    yaxis.ticker.ticks = ticks;
    yaxis.major_label_overrides = labels;
    plot.y_range.start = y + lane_gap;
    // taller than the figure's one screen (views.timeline._height): the page scrolls, and a lane stays readable
    plot.height = Math.round(Math.min(Math.max((y + strip + 2 * lane_gap) * row_px + 140, 240), 2400));
  } else {
    yaxis.ticker.ticks = saved.ticks;
    yaxis.major_label_overrides = saved.labels;
    plot.y_range.start = saved.start;
    plot.height = saved.height;
  }
  for (const rule of separators) rule.visible = reply.expanded == null;
  remote._wb_expanded = reply.expanded;
}
for (const lane of reply.lanes) {
  const top = tops[lane.lane], rows = heights[lane.lane];
  if (top == null) continue;
  const s = lane.spans, b = lane.bins;
  if (s != null) for (let i = 0; i < s.row.length; i++) {
    const start = s.start_ns[i], dur = s.dur_ns[i];
    cols.left.push(start); cols.right.push(start + dur); cols.y.push(top + s.depth[i] + 0.5);
    cols.lane.push(lane.lane); cols.depth.push(s.depth[i]); cols.instant_px.push(dur == 0 ? instant_px : 0);
    cols.dur_ns.push(dur); cols.name.push(names[s.name[i]] ?? ""); cols.kind.push(kinds[s.kind[i]] ?? "other");
    cols.shapes.push(""); cols.flops.push(s.flops[i] ?? NaN); cols.row.push(s.row[i]);
    cols.launched.push(s.launched[i]); cols.parent_idx.push(-1); launcher.push(s.launcher[i]);
  }
  if (b != null) for (let i = 0; i < b.bin.length; i++) {
    bars.x.push(reply.start_ns + (b.bin[i] + 0.5) * reply.bin_ns); bars.w.push(reply.bin_ns);
    bars.y.push(top + rows / 2); bars.h.push(rows - 0.1); bars.busy.push(b.busy[i]);
    bars.alpha.push(0.15 + 0.85 * b.busy[i]); bars.count.push(b.count[i]);
    const kind = b.kind[i] >= 0 ? kinds[b.kind[i]] : "other";
    bars.kind_id.push(Math.max(all_kinds.indexOf(kind), all_kinds.indexOf("other")));
    bars.name.push(b.name[i] >= 0 ? names[b.name[i]] : "");
  }
}
const position = new Map(cols.row.map((row, i) => [row, i]));
for (const row of launcher) {
  const j = row >= 0 ? position.get(row) : undefined;
  cols.launcher_idx.push(j ?? -1);
  cols.launcher_name.push(j != null ? cols.name[j] : "");
}
remote_bars.data_source.data = bars;
source.selected._linked = null;
source.selected.indices = [];
source.data = cols;
source.tags = [reply.start_ns, reply.end_ns];
const wanted = remote._wb_pending != null ? [remote._wb_pending] : [...kept];
remote._wb_pending = null;
const picked = wanted.map((row) => position.get(row)).filter((i) => i != null);
if (picked.length) source.selected.indices = picked;
"""
"""Replace the spans (and the busy lanes' per-pixel density) by a `spans` reply; selected events stay selected.
A reply with a folded lane expanded lays the lanes out anew (ticks, labels, height); the next one without
puts the figure's own layout back."""

SELECT = FORMAT + """
const key = cb_obj.indices.join(",");
if (cb_obj._linked === key) return;
const data = source.data, launcher = data.launcher_idx;
const picked = [...cb_obj.indices];
const out = new Set(picked);
for (const i of picked) if (launcher[i] >= 0) out.add(launcher[i]);
const chosen = new Set(picked);
for (let j = 0; j < launcher.length; j++) if (chosen.has(launcher[j])) out.add(j);
const indices = [...out].sort((a, b) => a - b);
cb_obj._linked = indices.join(",");
cb_obj.indices = indices;

const rel = {relation: [], name: [], start: [], duration: [], start_ns: [], dur_ns: [], index: [], row: []};
const ax = {x0: [], y0: [], x1: [], y1: []};
const fields = [], values = [];
const add = (field, value) => { fields.push(field); values.push(String(value)); };
const link = (relation, name, start, dur, index, row) => {
  rel.relation.push(relation); rel.name.push(name); rel.start.push(fmt_time(start)); rel.duration.push(fmt_time(dur));
  rel.start_ns.push(start); rel.dur_ns.push(dur); rel.index.push(index); rel.row.push(row);
};
const arrow = (from, to) => {
  ax.x0.push(Math.min(data.right[from], data.left[to])); ax.y0.push(data.y[from]);
  ax.x1.push(data.left[to]); ax.y1.push(data.y[to]);
};
const i = picked.length == 1 ? picked[0] : null;
details._wb_row = i == null ? null : data.row[i];  // what a late reply of the events route may still describe
if (i == null) {
  add(picked.length ? "selected" : "", picked.length ? `${fmt_count(picked.length)} spans (click one for its details)`
                                                     : "Click a span for its details.");
} else {
  add("name", data.name[i]); add("kind", data.kind[i]); add("lane", lane_names[data.lane[i]] ?? "\u2014");
  add("start", fmt_time(data.left[i])); add("duration", fmt_time(data.dur_ns[i])); add("end", fmt_time(data.right[i]));
  add("depth", fmt_count(data.depth[i])); add("flops", fmt_si(data.flops[i], "FLOP"));
  if (data.shapes[i]) add("input shapes", data.shapes[i]);
  add("launches", `${fmt_count(data.launched[i])} device events`); add("row", fmt_count(data.row[i]));
  if (launcher[i] >= 0) { link("launched by", data.name[launcher[i]], data.left[launcher[i]], data.dur_ns[launcher[i]],
                               launcher[i], data.row[launcher[i]]); arrow(launcher[i], i); }
  for (let j = 0; j < launcher.length; j++)
    if (launcher[j] == i) { link("launches", data.name[j], data.left[j], data.dur_ns[j], j, data.row[j]); arrow(i, j); }
}
details.data = {field: fields, value: values};
related.data = rel;
arrows.data = ax;
const api = remote._wb_api;
if (i != null && api != null) {
  const row = data.row[i];
  api.event(row).then((event) => {
    if (details._wb_row !== row) return;
    for (const field of ["device", "track", "pid", "tid", "corr", "parent", "dtypes"])
      if (event[field] != null && event[field] !== "" && event[field] !== -1) add(field, event[field]);
    if (event.bytes != null) add("bytes", fmt_si(event.bytes, "B"));
    if (event.shapes && !data.shapes[i]) add("input shapes", event.shapes);
    const args = event.args;
    if (args != null && typeof args == "object") {
      for (const [name, value] of Object.entries(args))
        add(`arg: ${name}`, typeof value == "string" ? value : JSON.stringify(value));
    } else if (args) add("args", args);
    details.data = {field: [...fields], value: [...values]};
    const known = new Set(rel.row);
    for (const [relation, list] of [["launched by", event.launched_by ?? []], ["launches", event.launches ?? []]])
      for (const other of list)
        if (!known.has(other.row)) link(relation, other.name, other.start_ns, other.dur_ns, -1, other.row);
    related.data = {...rel};
  }).catch((error) => {
    add("details", `could not fetch: ${error.message ?? error}`);
    details.data = {field: [...fields], value: [...values]};
  });
}
"""
"""A selection also selects the launcher or launched kernels of what was picked; one picked event fills the
details pane (and its args from the server in the panel), its related events and its flow arrows."""

FOLLOW_RELATED = JUMP + """
const k = cb_obj.indices[0];
if (k == null) return;
const index = related.data.index[k], row = related.data.row[k];
jump(xr, source, related.data.start_ns[k], related.data.dur_ns[k]);
if (index >= 0 && source.data.row[index] === row) source.selected.indices = [index];
else remote._wb_pending = row;
"""
"""A click on a related event (its launcher, a launched kernel) jumps to it and selects it."""

SEARCH = FORMAT + JUMP + """
const query = (input.value_input ?? input.value ?? "").trim();
const regex = use_regex.active.includes(0);
const api = remote._wb_api;
const state = status._wb_search ?? (status._wb_search = {key: null, matches: [], count: 0, at: -1});
const show = () => {
  const m = state.matches[state.at];
  if (m == null) return;
  status.text = `match ${fmt_count(state.at + 1)} of ${fmt_count(state.count)} for "${query}"` +
    (state.count > state.matches.length ? ` (the first ${fmt_count(state.matches.length)} listed)` : "") +
    (api == null ? " among the spans embedded here" : "");
  jump(xr, source, m.start_ns, m.dur_ns);
  const index = source.data.row.indexOf(m.row);
  if (index >= 0) source.selected.indices = [index];
  else remote._wb_pending = m.row;
};
const key = `${regex}:${query}`;
if (!query) { status.text = ""; state.key = null; return; }
if (key === state.key && state.matches.length) {
  state.at = (state.at + step + state.matches.length) % state.matches.length;
  show();
  return;
}
state.key = key;
if (api != null) {
  status.text = `searching for "${query}"\u2026`;
  api.search(query, regex).then((reply) => {
    if (state.key !== key) return;
    state.matches = reply.matches; state.count = reply.count; state.at = step < 0 ? reply.matches.length - 1 : 0;
    if (!reply.matches.length) status.text = `no event named like "${query}"`;
    else show();
  }).catch((error) => { state.key = null; status.text = error.message ?? String(error); });
  return;
}
let test;
try {
  const pattern = new RegExp(regex ? query : query.replace(/[.*+?^${}()|[\\]\\\\]/g, "\\\\$&"), "i");
  test = (name) => pattern.test(name);
} catch (error) {
  state.key = null;
  status.text = `not a regular expression: ${error.message}`;
  return;
}
const data = source.data, found = [];
for (let i = 0; i < data.name.length; i++) if (test(data.name[i])) found.push(i);
found.sort((a, b) => data.left[a] - data.left[b] || data.row[a] - data.row[b]);
state.matches = found.map((i) => ({row: data.row[i], start_ns: data.left[i], dur_ns: data.dur_ns[i]}));
state.count = found.length;
state.at = step < 0 ? found.length - 1 : 0;
if (!found.length) status.text = `no span named like "${query}" among the spans embedded here`;
else show();
"""
"""Search by name (case-insensitive substring, or a regular expression): the count, and next/previous (`step`)
jumping the timeline to the match and selecting it. The server searches the whole trace in the panel; elsewhere
the embedded spans are searched."""

AGGREGATE = FORMAT + """
const geometry = cb_obj.geometry;
if (geometry == null || geometry.x0 == null) return;
const a = Math.min(geometry.x0, geometry.x1), b = Math.max(geometry.x0, geometry.x1);
const what = `${fmt_time(b - a)} from ${fmt_time(a)}`;
const api = remote._wb_api;
const fill = (rows) => {
  table.data = {name: rows.map((r) => r.name), kind: rows.map((r) => r.kind), count: rows.map((r) => r.count),
                total_ms: rows.map((r) => r.total_ns / 1e6), self_ms: rows.map((r) => r.self_ns / 1e6)};
};
if (api != null) {
  info.text = `aggregating ${what}\u2026`;
  api.aggregate(Math.floor(a), Math.ceil(b)).then((reply) => {
    fill(reply.rows);
    info.text = `${fmt_count(reply.events)} events in ${what}: ${fmt_count(reply.groups)} names` +
      (reply.truncated ? ` (the first ${fmt_count(reply.rows.length)} by total time)` : "");
  }).catch((error) => { info.text = error.message ?? String(error); });
  return;
}
const tags = source.tags;
let covered = false;
for (let k = 0; k + 1 < tags.length; k += 2) if (a >= tags[k] && b <= tags[k + 1]) covered = true;
if (!covered) {
  fill([]);
  info.text = `${what} holds events that are not embedded here: select a range inside a dashed box`;
  return;
}
const data = source.data, groups = new Map(), inside = new Float64Array(data.left.length);
let events = 0;
for (let i = 0; i < data.left.length; i++) {
  const end = Math.max(data.right[i], data.left[i] + 1);
  if (data.left[i] >= b || end <= a) continue;
  events++;
  inside[i] = Math.max(0, Math.min(data.right[i], b) - Math.max(data.left[i], a));
}
const children = new Float64Array(data.left.length);
for (let i = 0; i < data.left.length; i++) if (data.parent_idx[i] >= 0) children[data.parent_idx[i]] += inside[i];
for (let i = 0; i < data.left.length; i++) {
  const end = Math.max(data.right[i], data.left[i] + 1);
  if (data.left[i] >= b || end <= a) continue;
  const key = `${data.kind[i]}\\u0000${data.name[i]}`;
  const g = groups.get(key) ?? {name: data.name[i], kind: data.kind[i], count: 0, total_ns: 0, self_ns: 0};
  g.count++; g.total_ns += inside[i]; g.self_ns += Math.max(inside[i] - children[i], 0);
  groups.set(key, g);
}
const rows = [...groups.values()].sort((x, y) => y.total_ns - x.total_ns || (x.name < y.name ? -1 : 1));
fill(rows);
info.text = `${fmt_count(events)} events in ${what}: ${fmt_count(rows.length)} names`;
"""
"""A range selected with the x box select: count, total and self time per name inside it (times clipped to it)."""

GO_TO_WINDOW = """
const k = Number(cb_obj.value);
if (!(k >= 0)) return;
const start = windows.data.left[k], end = windows.data.right[k], pad = (end - start) * 0.02;
xr.setv({start: start + pad, end: end - pad});
"""
"""The report's list of windows with real spans: choosing one shows it."""

ZOOM_TO_BAND = """
const i = cb_obj.indices[0];
if (i == null) return;
const left = bands.data.left[i], right = bands.data.right[i], pad = (right - left) * 0.02;
xr.setv({start: left - pad, end: right + pad});
"""
"""A click on a step or phase band zooms to it."""

TIME_HOVER = FORMAT + "return fmt_time(value);"
FLOPS_HOVER = FORMAT + "return fmt_si(source.data.flops[special_vars.index], 'FLOP');"
COUNT_HOVER = FORMAT + "return fmt_count(value);"
"""Tooltip formatters (`CustomJSHover` bodies) for times, flop counts and counts. The flop count is read from the
`source` by index: Bokeh writes NaN itself, before any formatter, for a NaN field."""


def hover(code: str, **args: object) -> CustomJSHover:
    """A tooltip formatter running `code` (one of the `*_HOVER` bodies) on the hovered `value`, with `args`."""
    return CustomJSHover(code=code, args=args)

EXPAND = """
if (cb_obj === remote) {  // the panel installed its API: expanding works there
  box.visible = remote._wb_api != null;
  if (remote._wb_expanded == null) pages.text = "";
  else {
    const e = remote._wb_expanded;
    pages.text = `tracks ${(e.offset + 1).toLocaleString()} to ${(e.offset + e.shown).toLocaleString()} of `
      + `${e.tracks.toLocaleString()}, busiest first`;
  }
  return;
}
const lane = picker.value === "" ? null : Number(picker.value);
const current = remote._wb_expand;
let offset = 0;
if (lane != null && current != null && current.lane == lane && step != 0)
  offset = Math.max(0, Math.min(current.offset + step * page, tracks[picker.value] - 1));
if (lane != null && step != 0 && current == null) return;
remote._wb_expand = lane == null ? null : {lane, offset};
if (remote._wb_fetch != null) remote._wb_fetch(true);
"""
"""The lane expander (in the panel): pick a folded lane to draw `page` of its tracks as lanes of their own,
step through them, or pick none to fold them again; its label says which tracks are shown."""
