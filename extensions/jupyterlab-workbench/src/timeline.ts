/**
 * The dashboard timeline's link to the server, and its state across redraws.
 *
 * The timeline's browser code (`workbench/views/timeline_js.py`) asks `remote._wb_api` for the spans of each
 * settled view, for searches, range aggregates and event details; this module installs that object on the
 * `timeline remote` model of an embedded dashboard, calling the server's routes (docs/api-spans.md) through
 * `requestAPI`, so every request carries Jupyter's auth (token header, XSRF cookie) like the rest of the
 * panel. The panel lays a dashboard out again when its width changes: `captureTimeline` and
 * `restoreTimeline` carry the zoom, the selected events, the active drag tool and the search text over.
 */

import { requestAPI } from './api';

/** Bokeh model names given by `workbench/views/timeline.py` and `timeline_panes.py`. */
const PLOT = 'timeline';
const SPANS = 'timeline spans';
const REMOTE = 'timeline remote';
const SEARCH = 'timeline search';

/** What the timeline's browser code calls (see `REQUEST`, `SEARCH`, `AGGREGATE`, `SELECT` there). */
export interface ITimelineApi {
  spans(startNs: number, endNs: number, widthPx: number, expand?: IExpand | null): Promise<unknown>;
  search(query: string, regex: boolean): Promise<unknown>;
  aggregate(startNs: number, endNs: number): Promise<unknown>;
  event(row: number): Promise<unknown>;
}

/** A folded lane drawn as its tracks, `offset` the first of them (the `spans` route's `expand`, `offset`). */
export interface IExpand {
  lane: number;
  offset: number;
}

/** The part of a BokehJS Document this module uses. */
interface IDocument {
  get_model_by_name(name: string): any;
}

/** What a redraw keeps of a timeline. */
export interface ITimelineState {
  start: number;
  end: number;
  rows: number[];
  dragTool: string | null;
  search: string;
}

/** The server's timeline routes for run `runId`. */
export function timelineApi(runId: string): ITimelineApi {
  const run = `runs/${encodeURIComponent(runId)}`;
  const query = (values: Record<string, string | number>) =>
    Object.entries(values)
      .map(([key, value]) => `${key}=${encodeURIComponent(String(value))}`)
      .join('&');
  return {
    spans: (startNs, endNs, widthPx, expand) =>
      requestAPI(
        `${run}/spans?${query({
          start_ns: Math.floor(startNs),
          end_ns: Math.ceil(endNs),
          width_px: widthPx,
          ...(expand ? { expand: expand.lane, offset: expand.offset } : {})
        })}`
      ),
    search: (q, regex) =>
      requestAPI(`${run}/search?${query({ q, regex: regex ? 1 : 0, limit: 10000 })}`),
    aggregate: (startNs, endNs) =>
      requestAPI(
        `${run}/aggregate?${query({ start_ns: Math.floor(startNs), end_ns: Math.ceil(endNs) })}`
      ),
    event: row => requestAPI(`${run}/events/${Math.floor(row)}`)
  };
}

/**
 * Give the timeline of `doc` (if it has one) the server's routes; the timeline then asks for the spans of
 * its view at once and of every settled view after.
 */
export function connectTimeline(doc: IDocument, api: ITimelineApi): boolean {
  const remote = doc.get_model_by_name(REMOTE);
  if (!remote) {
    return false;
  }
  remote._wb_api = api;
  // a change of its tags runs the timeline's request code and shows the lane expander (an empty reply: the
  // tags start empty, and setting them empty again would change nothing)
  remote.tags = [null];
  return true;
}

/** The zoom, selection, drag tool and search text of the timeline of `doc`; null when it has none. */
export function captureTimeline(doc: IDocument): ITimelineState | null {
  const plot = doc.get_model_by_name(PLOT);
  const spans = doc.get_model_by_name(SPANS);
  if (!plot || !spans) {
    return null;
  }
  const rows: number[] = spans.selected.indices.map((i: number) => spans.data.row[i]);
  const drag = plot.toolbar.tools.find((tool: any) => tool.active && tool.event_type === 'pan');
  return {
    start: plot.x_range.start,
    end: plot.x_range.end,
    rows,
    dragTool: drag ? drag.type : null,
    search: doc.get_model_by_name(SEARCH)?.value ?? ''
  };
}

/** Apply a captured state to the (newly drawn) timeline of `doc`. */
export function restoreTimeline(doc: IDocument, state: ITimelineState): void {
  const plot = doc.get_model_by_name(PLOT);
  const spans = doc.get_model_by_name(SPANS);
  if (!plot || !spans) {
    return;
  }
  const tool = plot.toolbar.tools.find((t: any) => t.type === state.dragTool);
  if (tool) {
    tool.active = true;
  }
  const search = doc.get_model_by_name(SEARCH);
  if (search && state.search) {
    search.value_input = state.search;
    search.value = state.search;
  }
  plot.x_range.setv({ start: state.start, end: state.end });
  const rows: number[] = spans.data.row;
  const picked = state.rows.map(row => rows.indexOf(row)).filter(i => i >= 0);
  if (picked.length) {
    spans.selected.indices = picked;
  } else if (state.rows.length) {
    const remote = doc.get_model_by_name(REMOTE);
    if (remote) {
      remote._wb_pending = state.rows[0]; // selected once the spans of the view arrive
    }
  }
}
