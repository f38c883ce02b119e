/**
 * Importing traces from the panel: files chosen with the Import button or dropped on the panel are uploaded
 * (`POST upload`), files of Lab's file browser are imported where they lie ("Open in Workbench", `POST import`);
 * either way the server runs `workbench import` as a job, which is followed here until it ends.
 *
 * One `ImportTracker` per panel holds the imports and tells its listeners when one moves on; `ImportList`
 * shows them, with each failure's reason.
 */

import * as React from 'react';

import { getJob, IJob, importPath, isFinished, uploadTrace } from './api';
import { errorMessage, POLL_MS } from './job';

/** One import: a file on its way into the traces root. */
export interface IImportItem {
  key: number;
  name: string;
  status: 'uploading' | 'importing' | 'done' | 'failed';
  error: string | null;
  runs: string[];
}

/** The panel's imports. `imported(runIds, open)` runs when one ends with new runs (`open`: show them). */
export class ImportTracker {
  constructor(private readonly _imported: (runIds: string[], open: boolean) => void) {}

  /** The imports, oldest first. */
  get items(): readonly IImportItem[] {
    return this._items;
  }

  /** Call `listener` whenever an import starts, moves on or is dismissed; returns how to stop. */
  listen(listener: () => void): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  /** Upload and import `files` (each its own job). */
  upload(files: Iterable<File>): void {
    for (const file of files) {
      void this._follow(file.name, 'uploading', () => uploadTrace(file), false);
    }
  }

  /** Import files of the server's root folder (paths as Lab's file browser gives them), then open them. */
  importPaths(paths: string[]): void {
    for (const path of paths) {
      void this._follow(path.split('/').pop() || path, 'importing', () => importPath(path), true);
    }
  }

  /** Forget a finished import. */
  dismiss(key: number): void {
    this._items = this._items.filter(item => item.key !== key);
    this._emit();
  }

  private async _follow(
    name: string,
    status: IImportItem['status'],
    start: () => Promise<IJob>,
    open: boolean
  ): Promise<void> {
    const key = ++this._count;
    this._items = [...this._items, { key, name, status, error: null, runs: [] }];
    this._emit();
    try {
      let job = await start();
      this._update(key, { status: 'importing' });
      while (!isFinished(job)) {
        await new Promise(resolve => window.setTimeout(resolve, POLL_MS));
        job = await getJob(job.id);
      }
      if (job.status !== 'succeeded') {
        throw new Error(job.error ?? `the import ${job.status}`);
      }
      const runs = Array.isArray(job.result) ? job.result : [];
      this._update(key, { status: 'done', runs });
      this._imported(runs, open);
    } catch (error) {
      this._update(key, { status: 'failed', error: errorMessage(error) });
    }
  }

  private _update(key: number, change: Partial<IImportItem>): void {
    this._items = this._items.map(item => (item.key === key ? { ...item, ...change } : item));
    this._emit();
  }

  private _emit(): void {
    this._listeners.forEach(listener => listener());
  }

  private _items: IImportItem[] = [];
  private _count = 0;
  private _listeners = new Set<() => void>();
}

/** Re-render with the tracker's imports whenever they change. */
export function useImports(tracker: ImportTracker): readonly IImportItem[] {
  const [items, setItems] = React.useState(tracker.items);
  React.useEffect(() => tracker.listen(() => setItems(tracker.items)), [tracker]);
  return items;
}

const LABELS: { [status in IImportItem['status']]: string } = {
  uploading: 'Uploading',
  importing: 'Importing',
  done: 'Imported',
  failed: 'Import failed:'
};

/** The imports in progress and their outcomes. */
export function ImportList(props: { tracker: ImportTracker }): JSX.Element | null {
  const items = useImports(props.tracker);
  if (items.length === 0) {
    return null;
  }
  return (
    <ul className="jp-Workbench-imports" aria-label="Imports">
      {items.map(item => (
        <li
          key={item.key}
          className={`jp-Workbench-import jp-mod-${item.status}`}
          role={item.status === 'failed' ? 'alert' : 'status'}
        >
          <span className="jp-Workbench-importText">
            {LABELS[item.status]} <bdi>{item.name}</bdi>
            {item.status === 'done' ? ` (${item.runs.length} run${item.runs.length === 1 ? '' : 's'})` : ''}
            {item.status === 'failed' ? ` ${item.error}` : item.status === 'done' ? '' : '…'}
          </span>
          {item.status === 'done' || item.status === 'failed' ? (
            <button
              className="jp-Workbench-linkButton"
              onClick={() => props.tracker.dismiss(item.key)}
              title="Dismiss"
            >
              ✕
            </button>
          ) : null}
        </li>
      ))}
    </ul>
  );
}

/** The Import button: choose trace files to upload. */
export function ImportButton(props: { tracker: ImportTracker }): JSX.Element {
  const input = React.useRef<HTMLInputElement>(null);
  return (
    <>
      <button
        className="jp-Button jp-mod-styled"
        onClick={() => input.current?.click()}
        title="Import trace files (Kineto/Chrome JSON or .json.gz, XSpace .xplane.pb, Nsight Systems .sqlite); or drop them on the panel"
      >
        Import…
      </button>
      <input
        ref={input}
        type="file"
        multiple
        hidden
        aria-label="trace files to import"
        className="jp-Workbench-importInput"
        onChange={event => {
          props.tracker.upload(Array.from(event.target.files ?? []));
          event.target.value = '';
        }}
      />
    </>
  );
}
