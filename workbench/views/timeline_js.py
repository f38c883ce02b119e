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

RELAYOUT = """
const relayout = () => {
  // views.timeline._lane_layout, from `lanes` (one row per lane drawn, in order; `collapsed` ones take one row)
  const L = lanes.data, top = new Map(), rows = new Map(), unit = new Map(), ticks = [], labels = new Map();
  const rules = [];
  let y = 0;
  for (let i = 0; i < L.lane.length; i++) {
    if (i > 0) {
      const new_device = L.device[i] != L.device[i - 1];
      y += new_device ? 2 * lane_gap : lane_gap;
      if (new_device) rules.push(y - lane_gap);
    }
    const r = L.collapsed[i] ? 1 : L.rows[i], u = L.device[i] == "cpu" ? 1 : Math.max(1, device_rows / r);
    top.set(L.lane[i], y); rows.set(L.lane[i], r); unit.set(L.lane[i], u);
    ticks.push(y + r * u / 2);
    labels.set(y + r * u / 2, (L.rows[i] > 1 ? (L.collapsed[i] ? "\u25b8 " : "\u25be ") : "") + L.text[i]);
    y += r * u;
  }
  const d = source.data, n = d.lane.length, sy = new Array(n), sh = new Array(n);
  for (let i = 0; i < n; i++) {
    const lane = d.lane[i], t = top.get(lane);
    if (t == null || d.depth[i] >= rows.get(lane)) { sy[i] = NaN; sh[i] = 0; continue; }  // in a collapsed lane
    sy[i] = t + (d.depth[i] + 0.5) * unit.get(lane);
    sh[i] = 0.8 * unit.get(lane);
  }
  source.data = {...d, y: sy, h: sh};
  for (const bars of [...levels, remote_bars]) {
    const b = bars.data_source.data, by = new Array(b.lane.length), bh = new Array(b.lane.length);
    for (let i = 0; i < b.lane.length; i++) {
      const lane = b.lane[i], t = top.get(lane);
      by[i] = t == null ? NaN : t + rows.get(lane) * unit.get(lane) / 2;
      bh[i] = t == null ? 0 : rows.get(lane) * unit.get(lane) - 0.1;
    }
    bars.data_source.data = {...b, y: by, h: bh};
  }
  yaxis.ticker.ticks = ticks;
  yaxis.major_label_overrides = labels;
  separators.forEach((rule, k) => { rule.visible = k < rules.length; if (k < rules.length) rule.location = rules[k]; });
  for (const r of bottoms) r.glyph.bottom = {value: y};
  for (const r of tops) r.glyph.top = {value: y};
  plot.y_range.start = y + lane_gap;
  // taller than the figure's one screen (views.timeline._height) once lanes are expanded: the page scrolls
  plot.height = Math.round(Math.min(Math.max((y + strip + 2 * lane_gap) * row_px + 140, 240),
                                    L.lane.length > lane_text.length ? tall_px : max_px));
  const focus = source._wb_focus, at = focus == null ? -1 : source.data.row.indexOf(focus);
  if (at >= 0) { source.selected._linked = null; source.selected.indices = [at]; }
};
"""
"""`relayout()`: place every lane from the `lanes` source (its rows, or one when collapsed: its deeper spans are then
hidden; a device lane at least `device_rows` tall) and move what is drawn to match: spans, density bars, the lane
labels (a triangle marks a lane that collapses or expands), the device rules, the bands and boxes, the y-range and
the figure's height; the focused span is selected again so its marker and arrows follow."""

COLLAPSE_CALLBACK = "timeline collapse"
"""`name` of the figure's `COLLAPSE` callback (the panes' lane list runs the same code with the same args)."""

COLLAPSE = RELAYOUT + """
const L = lanes.data, collapsed = [...L.collapsed];
if (what != null) {  // the panes' buttons: every lane of several rows
  for (let i = 0; i < L.lane.length; i++) collapsed[i] = what == "collapse" && L.rows[i] > 1;
} else {  // a click left of the plot's frame: on a lane's label
  const view = (cb_context?.index ?? Bokeh.index).find_one(plot);
  if (view == null || cb_obj.sx >= view.frame.bbox.left) return;
  const ticks = yaxis.ticker.ticks;
  let i = -1;
  for (let k = 0; k < ticks.length; k++)
    if (i < 0 || Math.abs(cb_obj.y - ticks[k]) < Math.abs(cb_obj.y - ticks[i])) i = k;
  if (i < 0 || L.rows[i] < 2) return;
  collapsed[i] = !collapsed[i];
}
lanes.data = {...L, collapsed};
relayout();
"""
"""A lane collapses to one row (its top-level spans; deeper ones hidden) or expands back: a click on its label (`what`
null: the figure's tap), or all lanes at once (`what` "collapse" or "expand": the panes' buttons)."""

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
    if (right[i] <= x0 || left[i] >= x1 || !isFinite(y[i])) continue;  // out of view, or in a collapsed lane
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

APPLY_REPLY = RELAYOUT + """
const reply = remote.tags[0];
if (reply == null || reply.lanes == null) return;
const names = reply.names, kinds = reply.kinds;
const old = source.data, kept = new Set(source.selected.indices.map((i) => old.row[i]));
const cols = {left: [], right: [], y: [], h: [], lane: [], depth: [], instant_px: [], dur_ns: [], name: [], kind: [],
              shapes: [], flops: [], row: [], launcher_idx: [], launcher_name: [], launched: [], parent_idx: [],
              launch: []};
const launcher = [];
const bars = {lane: [], x: [], w: [], y: [], h: [], alpha: [], kind_id: [], name: [], count: [], busy: []};
{
  // the reply's lanes (a folded lane expanded adds lanes; the next reply without puts the figure's back), each
  // keeping its collapsed state
  const was = lanes.data, collapsed = new Set(was.lane.filter((lane, i) => was.collapsed[i]));
  const text = reply.lanes.map((lane) => lane.parent != null || lane.lane == reply.expanded?.lane
    ? `${lane.device} \u00b7 ${lane.label}` : lane_text[lane.lane] ?? `${lane.device} \u00b7 ${lane.label}`);
  lanes.data = {lane: reply.lanes.map((lane) => lane.lane), device: reply.lanes.map((lane) => lane.device),
                rows: reply.lanes.map((lane) => lane.rows), text,
                collapsed: reply.lanes.map((lane) => collapsed.has(lane.lane))};
  remote._wb_expanded = reply.expanded;
}
for (const lane of reply.lanes) {
  const s = lane.spans, b = lane.bins;
  if (s != null) for (let i = 0; i < s.row.length; i++) {
    const start = s.start_ns[i], dur = s.dur_ns[i];
    cols.left.push(start); cols.right.push(start + dur); cols.y.push(NaN); cols.h.push(0.8);  // placed by relayout
    cols.lane.push(lane.lane); cols.depth.push(s.depth[i]); cols.instant_px.push(dur == 0 ? instant_px : 0);
    cols.dur_ns.push(dur); cols.name.push(names[s.name[i]] ?? ""); cols.kind.push(kinds[s.kind[i]] ?? "other");
    cols.shapes.push(""); cols.flops.push(s.flops[i] ?? NaN); cols.row.push(s.row[i]);
    cols.launched.push(s.launched[i]); cols.parent_idx.push(-1); cols.launch.push(reply.launch?.[s.launch?.[i]] ?? "");
    launcher.push(s.launcher[i]);
  }
  if (b != null) for (let i = 0; i < b.bin.length; i++) {
    bars.x.push(reply.start_ns + (b.bin[i] + 0.5) * reply.bin_ns); bars.w.push(reply.bin_ns);
    bars.lane.push(lane.lane); bars.y.push(NaN); bars.h.push(0); bars.busy.push(b.busy[i]);
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
const focus = remote._wb_pending ?? source._wb_focus;
source.selected._linked = null;
source.selected.indices = [];
source.data = cols;
source.tags = [reply.start_ns, reply.end_ns];
source._wb_focus = null;
relayout();
const wanted = focus != null ? [focus] : [...kept];
remote._wb_pending = null;
const picked = wanted.map((row) => position.get(row)).filter((i) => i != null);
if (picked.length) source.selected.indices = picked;
else if (focus != null) {  // panned away from it (or its lane is density now): its details stay
  source._wb_focus = focus;
  source.selected._wb_quiet = true;
}
"""
"""Replace the spans (and the busy lanes' per-pixel density) by a `spans` reply and lay its lanes out
(`RELAYOUT`: a folded lane expanded adds lanes, the next reply without puts the figure's back). The focused event
(the one whose details are shown, or a search match or jump target still to come: `remote._wb_pending`) is
selected again, else whatever was selected; a reply without the focused event leaves the details showing it."""

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

REDRAW_TABLE = """
table.view.change.emit();
"""
"""Redraw a table whose source has new data (see `views.timeline_panes._table_of`)."""

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
