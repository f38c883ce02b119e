/**
 * A run's trace for Perfetto from its dashboard: downloaded as a file (Perfetto's protobuf, or Chrome Trace Event
 * JSON for chrome://tracing), or opened in ui.perfetto.dev directly.
 *
 * Opening follows Perfetto's documented deep-linking protocol (perfetto.dev/docs/visualization/deep-linking-to-
 * perfetto-ui), as the static report's button does (`workbench/views/perfetto_link.py`): open the UI with
 * `window.open` in the click itself (so no popup blocker stops it), fetch the export, post `'PING'` until the UI
 * answers `'PONG'`, then post `{perfetto: {buffer, title, fileName}}`. The UI's page is Google's: only the trace's
 * bytes go to it, and they stay in that browser tab (Perfetto UI loads traces locally).
 */

import { ExportFormat, fetchRunExport } from './api';

export const PERFETTO_UI = 'https://ui.perfetto.dev';
/** How often the UI is pinged until it answers (ms), as the report does. */
export const PING_MS = 50;
/** How long the UI has to answer before the panel stops asking (ms). */
export const PONG_TIMEOUT_MS = 60_000;

/** Save `blob` as `fileName` through the browser's download. */
export function saveFile(blob: Blob, fileName: string): void {
  const url = URL.createObjectURL(blob);
  const link = document.createElement('a');
  link.href = url;
  link.download = fileName;
  link.style.display = 'none';
  document.body.appendChild(link);
  link.click();
  link.remove();
  window.setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/**
 * Download run `runId`'s trace in `format` (the server writes it: `workbench export`); a Perfetto trace carries the
 * critical path of the typical step as a track of its own.
 */
export async function downloadExport(runId: string, format: ExportFormat): Promise<void> {
  const { blob, fileName } = await fetchRunExport(runId, format, format === 'perfetto');
  saveFile(blob, fileName);
}

/**
 * Open run `runId`'s Perfetto trace (with its critical path's track) in ui.perfetto.dev under `title`. Must be called in a click's handler (the
 * window opens at once). Rejects with why it could not (a blocked window, an export the server refused, a UI that
 * never answered); the UI's window is closed then, unless it was the UI that did not answer.
 */
export async function openInPerfetto(runId: string, title: string): Promise<void> {
  const win = window.open(PERFETTO_UI);
  if (!win) {
    throw new Error('the browser blocked the Perfetto UI\'s window: allow pop-ups for this page, or download the ' +
      'trace and open it at ' + PERFETTO_UI);
  }
  let buffer: ArrayBuffer;
  let fileName: string;
  try {
    const exported = await fetchRunExport(runId, 'perfetto', true);
    buffer = await exported.blob.arrayBuffer();
    fileName = exported.fileName;
  } catch (error) {
    win.close();
    throw error;
  }
  await new Promise<void>((resolve, reject) => {
    const timer = window.setInterval(() => win.postMessage('PING', PERFETTO_UI), PING_MS);
    const stop = () => {
      window.clearInterval(timer);
      window.clearTimeout(deadline);
      window.removeEventListener('message', answer);
    };
    const answer = (event: MessageEvent) => {
      if (event.source !== win || event.data !== 'PONG') {
        return;
      }
      stop();
      win.postMessage({ perfetto: { buffer, title, fileName } }, PERFETTO_UI);
      resolve();
    };
    const deadline = window.setTimeout(() => {
      stop();
      reject(new Error(`${PERFETTO_UI} did not answer within ${PONG_TIMEOUT_MS / 1000} s (is it reachable from ` +
        'this browser?): download the trace and open it there'));
    }, PONG_TIMEOUT_MS);
    window.addEventListener('message', answer);
  });
}
