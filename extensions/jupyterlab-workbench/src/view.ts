/**
 * The main-area view: one run's dashboard, the comparison of several runs, a quantization job's lab, a replay job's
 * ops or a projection job's report, drawn by BokehJS.
 *
 * Resizing: the workbench layouts have fixed pixel widths (tables, linked timelines), so the view asks
 * the server for a layout as wide as the panel, and asks again, once the size has settled, when the
 * panel's width changes by more than `RELAYOUT_PX`. The old plots stay in place until the new ones are
 * drawn; a reply that arrives after a newer request is dropped. A redraw keeps the timeline's zoom, selection,
 * drag tool and search (`timeline.ts`), and a run's timeline asks the server for the spans of each view.
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  fetchComparison,
  fetchDashboard,
  fetchProjectView,
  fetchQuantView,
  fetchReplayView,
  IBokehItem
} from './api';
import { EmbeddedItem, embedItem } from './bokeh';
import {
  captureTimeline,
  connectTimeline,
  restoreTimeline,
  timelineApi
} from './timeline';

/** Layout widths the server accepts (`WIDTHS` in handlers.py). */
export const MIN_WIDTH = 400;
export const MAX_WIDTH = 4000;
/** Width change (pixels) after which the layout is fetched again. */
export const RELAYOUT_PX = 48;
/** Quiet time (ms) after the last resize before the layout is fetched again. */
const RESIZE_SETTLE_MS = 350;

/** What a view shows: the runs (and the baseline of a comparison), and how to fetch their layout at a width. */
export interface IViewSource {
  runs: string[];
  /** The run a comparison is drawn against; null for the server's rule (and for a dashboard). */
  baseline: string | null;
  fetch(width: number): Promise<IBokehItem>;
}

/** The source for `runs`: a dashboard for one run, a comparison for several (against `baseline` when given). */
export function viewSource(runs: string[], baseline: string | null = null): IViewSource {
  if (runs.length === 1) {
    return { runs, baseline: null, fetch: width => fetchDashboard(runs[0], width) };
  }
  return { runs, baseline, fetch: width => fetchComparison(runs, width, baseline) };
}

/** The source for the views of the quantization job `jobId` (no run: the lab's results are kept by its job). */
export function quantSource(jobId: string): IViewSource {
  return { runs: [], baseline: null, fetch: width => fetchQuantView(jobId, width) };
}

/** The source for the view of the replay job `jobId` (drawn from the job's result: no replay runs again). */
export function replaySource(jobId: string): IViewSource {
  return { runs: [], baseline: null, fetch: width => fetchReplayView(jobId, width) };
}

/** The source for the report of the projection job `jobId` (drawn from the job's result: nothing is projected again). */
export function projectSource(jobId: string): IViewSource {
  return { runs: [], baseline: null, fetch: width => fetchProjectView(jobId, width) };
}

/** A panel that draws the Bokeh layout of a `IViewSource`. */
export class BokehView extends Widget {
  constructor(
    readonly source: IViewSource,
    private readonly _baseUrl: string
  ) {
    super();
    this.addClass('jp-Workbench-view');
    this._status = document.createElement('div');
    this._status.className = 'jp-Workbench-viewStatus';
    this._plot = document.createElement('div');
    this._plot.className = 'jp-Workbench-plot';
    this.node.append(this._status, this._plot);
  }

  /** The runs shown. */
  get runs(): string[] {
    return this.source.runs;
  }

  /** Fetch and draw the layout again at the panel's current width. */
  async refresh(): Promise<void> {
    const request = ++this._request;
    const width = this._layoutWidth();
    this._showStatus(this._embedded ? 'Updating…' : 'Loading…', false);
    try {
      const item = await this.source.fetch(width);
      if (request !== this._request || this.isDisposed) {
        return;
      }
      // BokehJS draws only into an element of the document: a hidden one until the plots are drawn
      const target = document.createElement('div');
      target.className = 'jp-Workbench-plot jp-mod-pending';
      this.node.appendChild(target);
      let embedded: EmbeddedItem;
      try {
        embedded = await embedItem(this._baseUrl, item, target);
      } catch (error) {
        target.remove();
        throw error;
      }
      if (request !== this._request || this.isDisposed) {
        embedded.dispose();
        target.remove();
        return;
      }
      const doc = embedded.document;
      if (doc && this.source.runs.length === 1) {
        connectTimeline(doc, timelineApi(this.source.runs[0]));
      }
      const kept = this._embedded?.document
        ? captureTimeline(this._embedded.document)
        : null;
      if (doc && kept) {
        restoreTimeline(doc, kept);
      }
      this._embedded?.dispose();
      this._plot.remove();
      target.classList.remove('jp-mod-pending');
      this._plot = target;
      this._embedded = embedded;
      this._width = width;
      this._showStatus('', false);
    } catch (error) {
      if (request === this._request && !this.isDisposed) {
        this._showStatus((error as Error).message ?? String(error), true);
      }
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearTimeout(this._resizeTimer);
    this._embedded?.dispose();
    this._embedded = null;
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this._width === 0 && this._request === 0) {
      // after the dock panel has laid the new widget out, so that its width is known
      window.requestAnimationFrame(() => void this.refresh());
    }
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    if (this._width === 0 || !this.isVisible) {
      return;
    }
    window.clearTimeout(this._resizeTimer);
    this._resizeTimer = window.setTimeout(() => {
      if (Math.abs(this._layoutWidth() - this._width) >= RELAYOUT_PX) {
        void this.refresh();
      }
    }, RESIZE_SETTLE_MS);
  }

  /** The layout width that fills the panel (less its padding and a scroll bar), within the server's bounds. */
  private _layoutWidth(): number {
    const style = window.getComputedStyle(this.node);
    const padding =
      parseFloat(style.paddingLeft || '0') + parseFloat(style.paddingRight || '0');
    const inner = this.node.clientWidth - padding - 24;
    return Math.round(Math.min(MAX_WIDTH, Math.max(MIN_WIDTH, inner)));
  }

  private _showStatus(text: string, isError: boolean): void {
    this._status.textContent = text;
    this._status.classList.toggle('jp-Workbench-error', isError);
    this._status.setAttribute('role', isError ? 'alert' : 'status');
    this._status.hidden = text === '';
  }

  private _status: HTMLDivElement;
  private _plot: HTMLDivElement;
  private _embedded: EmbeddedItem | null = null;
  private _width = 0;
  private _request = 0;
  private _resizeTimer = 0;
}
