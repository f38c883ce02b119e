"""The timeline's browser code for the event in focus (BokehJS `CustomJS` bodies): what a click on a span, a search
match or a jump to a related event selects, and what the details pane, the related events, the flow arrows and the
focus marker then show. Kept apart from `views.timeline_js` (the view's other browser code), which it builds on."""

from __future__ import annotations

from workbench.views.timeline_js import FORMAT, JUMP

SELECT = FORMAT + """
const key = cb_obj.indices.join(",");
if (cb_obj._linked === key) return;
const quiet = cb_obj._wb_quiet;
cb_obj._wb_quiet = false;
if (quiet && !cb_obj.indices.length) return;  // new spans without the focused event: keep showing it
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
let facts = [], launch_at = 0;  // a kernel's launch facts and where they go in the details
source._wb_focus = details._wb_row;  // the event shown: a new reply or a relayout selects it again
focus.data = i == null ? {x: [], left: [], right: [], y: [], h: []}
  : {x: [data.left[i]], left: [data.left[i]], right: [Math.max(data.right[i], data.left[i])], y: [data.y[i]],
     h: [data.h[i]]};
marker.location = i == null ? null : data.left[i];
marker.visible = i != null;
if (i == null) {
  add(picked.length ? "selected" : "", picked.length ? `${fmt_count(picked.length)} spans (click one for its details)`
                                                     : "Click a span for its details.");
} else {
  add("name", data.name[i]); add("kind", data.kind[i]); add("lane", lane_names[data.lane[i]] ?? "\u2014");
  add("start", fmt_time(data.left[i])); add("duration", fmt_time(data.dur_ns[i])); add("end", fmt_time(data.right[i]));
  // a kernel's launch facts next (grid, block, ..., its launching op): in the panel they come with its args
  facts = data.launch[i] ? data.launch[i].split("\\n").map((line) => line.split("\\t"))
    .map(([k, value]) => [launch_fields[Number(k)] ?? k, value]) : [];
  for (const [field, value] of facts) add(field, value);
  launch_at = fields.length;
  add("depth", fmt_count(data.depth[i])); add("flops", fmt_si(data.flops[i], "FLOP"));
  if (data.shapes[i]) add("input shapes", data.shapes[i]);
  add("launches", `${fmt_count(data.launched[i])} device events`); add("row", fmt_count(data.row[i]));
  if (launcher[i] >= 0) { link("launched by", data.name[launcher[i]], data.left[launcher[i]], data.dur_ns[launcher[i]],
                               launcher[i], data.row[launcher[i]]); arrow(launcher[i], i); }
  for (let j = 0; j < launcher.length; j++)
    if (launcher[j] == i) { link("launches", data.name[j], data.left[j], data.dur_ns[j], j, data.row[j]); arrow(i, j); }
}
// copies: a late reply of the events route adds to these arrays, and BokehJS sees no change in data it already holds
details.data = {field: [...fields], value: [...values]};
related.data = Object.fromEntries(Object.entries(rel).map(([key, column]) => [key, [...column]]));
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
    if (!facts.length && event.launch?.length) {  // in their place, after the times
      fields.splice(launch_at, 0, ...event.launch.map(([field]) => field));
      values.splice(launch_at, 0, ...event.launch.map(([, value]) => String(value)));
    }
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
    related.data = Object.fromEntries(Object.entries(rel).map(([key, column]) => [key, [...column]]));
  }).catch((error) => {
    add("details", `could not fetch: ${error.message ?? error}`);
    details.data = {field: [...fields], value: [...values]};
  });
}
"""
"""A selection also selects the launcher or launched kernels of what was picked; one picked event is the focus: it
fills the details pane (its launch facts for a kernel, and its args from the server in the panel), its related
events and its flow arrows, and is outlined with a vertical marker at its start (`focus`, `marker`)."""

FOCUS_ON = FORMAT + """
const focus_on = (event) => {
  const index = source.data.row.indexOf(event.row);
  if (index >= 0) {
    source.selected._linked = null;
    source.selected.indices = [index];
    return;
  }
  // its spans come with the reply to the jump: say what it is meanwhile, and mark where it starts
  remote._wb_pending = event.row;
  source._wb_focus = event.row;
  details._wb_row = event.row;
  details.data = {field: ["name", "kind", "start", "duration", "row", ""],
                  value: [event.name, event.kind ?? "\u2014", fmt_time(event.start_ns), fmt_time(event.dur_ns),
                          fmt_count(event.row), "fetching its spans\u2026"]};
  marker.location = event.start_ns;
  marker.visible = true;
};
"""
"""`focus_on({row, name, kind, start_ns, dur_ns})`: select an event the view has just jumped to, so the details
pane shows it; in the panel, when its spans are still to come, show what is known of it now and select it when
they arrive (`remote._wb_pending`, see `APPLY_REPLY`)."""

FOLLOW_RELATED = JUMP + FOCUS_ON + """
const k = cb_obj.indices[0];
if (k == null) return;
const r = related.data, index = r.index[k], row = r.row[k];
jump(xr, source, r.start_ns[k], r.dur_ns[k]);
if (index >= 0 && source.data.row[index] === row) {
  source.selected._linked = null;
  source.selected.indices = [index];
} else focus_on({row, name: r.name[k], kind: null, start_ns: r.start_ns[k], dur_ns: r.dur_ns[k]});
"""
"""A click on a related event (its launcher, a launched kernel) jumps to it and selects it."""

SEARCH = JUMP + FOCUS_ON + """
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
  focus_on(m);
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
state.matches = found.map((i) => ({row: data.row[i], start_ns: data.left[i], dur_ns: data.dur_ns[i],
                                   name: data.name[i], kind: data.kind[i]}));
state.count = found.length;
state.at = step < 0 ? found.length - 1 : 0;
if (!found.length) status.text = `no span named like "${query}" among the spans embedded here`;
else show();
"""
"""Search by name (case-insensitive substring, or a regular expression): the count, and next/previous (`step`)
jumping the timeline to the match and selecting it. The server searches the whole trace in the panel; elsewhere
the embedded spans are searched."""
