/**
 * The Workbench sidebar: the traces folder, the capture form, the serving form, the quantization lab, accelerator
 * co-design (projection), the runs with their actions (open, compare, replay ops, delete, import; trace files dropped
 * on the panel are imported too) and the SQL query box. The runs list refreshes itself when runs appear or vanish: it polls the server's cheap
 * `traces/version` every `WATCH_MS`.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { deleteRun, IJob, IListing, IRunRow, listRuns, setTracesRoot, tracesVersion } from './api';
import { CaptureSection } from './capture';
import { ErrorNote } from './form';
import { workbenchIcon } from './icon';
import { ImportButton, ImportList, ImportTracker } from './imports';
import { IProjectPreset, ProjectSection } from './project';
import { QuantSection } from './quant';
import { QuerySection } from './query';
import { IQueryShown } from './queryView';
import { RunList, runLabel } from './runs';
import { ServeSection } from './serve';

/** How often the panel asks whether runs appeared or vanished (ms). */
export const WATCH_MS = 2000;

/** What the sidebar asks of the application. */
export interface ISidebarActions {
  /** Open the dashboard of each run. */
  open(runIds: string[]): void;
  /** Open the comparison of two or more runs against `baseline` (one of them; null: the server's rule). */
  compare(runIds: string[], baseline: string | null): void;
  /** Show the views of a succeeded quantization job in the main area. */
  showQuant(job: IJob): void;
  /** Open the op replay tab of a run. */
  showReplay(runId: string): void;
  /** Open the tab of a projection job (its progress, then its report). */
  showProject(job: IJob): void;
  /** Show a query's result in the main area. */
  showQuery(shown: IQueryShown): void;
  /** The runs were deleted: close their views. */
  deleted(runIds: string[]): void;
  /** The runs as just listed (for the titles of their views). */
  listed(rows: IRunRow[]): void;
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

interface IPanelProps {
  actions: ISidebarActions;
  /** Changes whenever the runs must be listed again (refresh command, traces folder setting). */
  generation: number;
  /** Why the traces folder setting could not be applied, if it could not. */
  rootError: string | null;
  imports: ImportTracker;
  /** A run to project, asked for by its dashboard's toolbar: the co-design section opens with it. */
  projectPreset: IProjectPreset | null;
}

function WorkbenchPanel(props: IPanelProps): JSX.Element {
  const { actions } = props;
  const [listing, setListing] = React.useState<IListing | null>(null);
  const [listError, setListError] = React.useState<string | null>(null);
  const [actionError, setActionError] = React.useState<string | null>(null);
  const [loading, setLoading] = React.useState(false);
  const [deleting, setDeleting] = React.useState(false);
  const [selected, setSelected] = React.useState<Set<string>>(new Set());
  /** The baseline chosen for a comparison ('' for the server's rule). */
  const [baseline, setBaseline] = React.useState('');
  const [dropping, setDropping] = React.useState(false);
  const projectSection = React.useRef<HTMLDetailsElement>(null);
  const listed = React.useRef(actions.listed);
  listed.current = actions.listed;

  const refresh = React.useCallback(async () => {
    setLoading(true);
    try {
      const next = await listRuns();
      const present = new Set(next.runs.map(row => row.run));
      setListing(next);
      listed.current(next.runs);
      setListError(null);
      setSelected(current => new Set([...current].filter(id => present.has(id))));
    } catch (error) {
      setListError(`cannot list the runs: ${message(error)}`);
    } finally {
      setLoading(false);
    }
  }, []);

  React.useEffect(() => {
    void refresh();
  }, [props.generation]);

  React.useEffect(() => {
    if (props.projectPreset && projectSection.current) {
      projectSection.current.open = true;
      projectSection.current.scrollIntoView({ block: 'nearest' });
    }
  }, [props.projectPreset]);

  // List again when runs appear or vanish (a capture, an import, `workbench rm` in a terminal).
  React.useEffect(() => {
    let last: string | null = null;
    let stopped = false;
    const watch = async () => {
      if (document.hidden) {
        return;
      }
      try {
        const version = await tracesVersion();
        if (!stopped && last !== null && version !== last) {
          void refresh();
        }
        last = version;
      } catch {
        // the list shows why the server cannot be reached when it is refreshed
      }
    };
    void watch();
    const timer = window.setInterval(() => void watch(), WATCH_MS);
    return () => {
      stopped = true;
      window.clearInterval(timer);
    };
  }, [props.generation, refresh]);

  const select = (runIds: string[], on: boolean) =>
    setSelected(current => {
      const next = new Set(current);
      runIds.forEach(id => (on ? next.add(id) : next.delete(id)));
      return next;
    });

  const orderedRows = (listing?.runs ?? []).filter(row => selected.has(row.run));
  const ordered = orderedRows.map(row => row.run);
  const against = ordered.includes(baseline) ? baseline : '';

  const remove = async () => {
    const ids = ordered;
    const answer = await showDialog({
      title: `Delete ${ids.length} run${ids.length === 1 ? '' : 's'}?`,
      body: (
        <div className="jp-Workbench-confirm">
          <p>{ids.length === 1 ? 'Its bundle is' : 'Their bundles are'} removed from disk:</p>
          <ul>
            {ids.map(id => (
              <li key={id}>{id}</li>
            ))}
          </ul>
        </div>
      ),
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
    });
    if (!answer.button.accept) {
      return;
    }
    setDeleting(true);
    setActionError(null);
    const deleted: string[] = [];
    const failures: string[] = [];
    for (const id of ids) {
      try {
        await deleteRun(id);
        deleted.push(id);
      } catch (error) {
        failures.push(`${id}: ${message(error)}`);
      }
    }
    if (failures.length > 0) {
      setActionError(`cannot delete ${failures.join('; ')}`);
    }
    if (deleted.length > 0) {
      actions.deleted(deleted);
    }
    setDeleting(false);
    await refresh();
  };

  const finished = (job: IJob) => {
    if (job.status === 'succeeded' || job.status === 'failed') {
      void refresh(); // a failed capture may still have written some variants
    }
  };

  const hasFiles = (event: React.DragEvent) => Array.from(event.dataTransfer.types).includes('Files');
  const count = ordered.length;
  return (
    <div
      className={'jp-Workbench-panel' + (dropping ? ' jp-mod-dropping' : '')}
      onDragOver={event => {
        if (hasFiles(event)) {
          event.preventDefault();
          event.dataTransfer.dropEffect = 'copy';
          setDropping(true);
        }
      }}
      onDragLeave={event => {
        if (event.currentTarget === event.target) {
          setDropping(false);
        }
      }}
      onDrop={event => {
        if (hasFiles(event)) {
          event.preventDefault();
          setDropping(false);
          props.imports.upload(Array.from(event.dataTransfer.files));
        }
      }}
    >
      <header className="jp-Workbench-header">
        <h2>Workbench</h2>
        <button
          className="jp-Button jp-mod-minimal jp-Workbench-refresh"
          onClick={() => void refresh()}
          title="List the runs again"
          disabled={loading}
        >
          {loading ? 'Refreshing…' : 'Refresh'}
        </button>
      </header>
      <ErrorNote text={props.rootError} />
      {listing ? (
        <div className="jp-Workbench-root" title={`traces folder: ${listing.root}`}>
          <span>traces:</span>
          <span className="jp-Workbench-rootPath">
            <bdi dir="ltr">{listing.root}</bdi>
          </span>
        </div>
      ) : null}
      <details className="jp-Workbench-section" open>
        <summary>Capture</summary>
        <CaptureSection onFinished={finished} />
      </details>
      <details className="jp-Workbench-section jp-Workbench-serveSection">
        <summary>Serving</summary>
        <ServeSection onFinished={finished} onOpen={actions.open} />
      </details>
      <details className="jp-Workbench-section jp-Workbench-quantSection">
        <summary>Quantization</summary>
        <QuantSection onShow={actions.showQuant} />
      </details>
      <details className="jp-Workbench-section jp-Workbench-projectSection" ref={projectSection}>
        <summary>Co-design</summary>
        <ProjectSection runs={listing?.runs ?? []} selected={ordered} preset={props.projectPreset}
          onShow={actions.showProject} />
      </details>
      <details className="jp-Workbench-section" open>
        <summary>
          Runs{listing ? ` (${listing.runs.length})` : ''}
          <span className="jp-Workbench-count">{count > 0 ? ` · ${count} selected` : ''}</span>
        </summary>
        <div className="jp-Workbench-actions">
          <button
            className="jp-Button jp-mod-styled"
            disabled={count < 1}
            onClick={() => actions.open(ordered)}
            title="Open the dashboard of each selected run"
          >
            Open
          </button>
          <button
            className="jp-Button jp-mod-styled"
            disabled={count < 2}
            onClick={() => actions.compare(ordered, against || null)}
            title="Compare the selected runs (two or more) against the baseline chosen beside"
          >
            Compare
          </button>
          <button
            className="jp-Button jp-mod-styled"
            disabled={count !== 1}
            onClick={() => actions.showReplay(ordered[0])}
            title={"Op replay: rebuild the selected run's top ops from the shapes its trace recorded and time each " +
              'alone (one run)'}
          >
            Replay
          </button>
          <button
            className="jp-Button jp-mod-styled jp-mod-warn"
            disabled={count < 1 || deleting}
            onClick={() => void remove()}
            title="Delete the selected runs from disk"
          >
            {deleting ? 'Deleting…' : 'Delete'}
          </button>
          <ImportButton tracker={props.imports} />
        </div>
        {count >= 2 ? (
          <div className="jp-Workbench-field jp-Workbench-baseline">
            <label htmlFor="jp-Workbench-baseline">Compare against</label>
            <select
              id="jp-Workbench-baseline"
              className="jp-mod-styled"
              value={against}
              onChange={event => setBaseline(event.target.value)}
              title="The run the others are compared with"
            >
              <option value="">automatic: the reference variant (eager) if selected, else the first run</option>
              {orderedRows.map(row => (
                <option key={row.run} value={row.run} title={row.run}>
                  {runLabel(row, row.run)}
                </option>
              ))}
            </select>
          </div>
        ) : null}
        <ImportList tracker={props.imports} />
        <ErrorNote text={actionError} />
        <ErrorNote text={listError} />
        {listing ? (
          <RunList listing={listing} selected={selected} onSelect={select} onOpen={actions.open} />
        ) : loading ? (
          <p className="jp-Workbench-empty">Loading runs…</p>
        ) : null}
        {listing && listing.problems.length > 0 ? (
          <details className="jp-Workbench-problems">
            <summary>
              {listing.problems.length} entr{listing.problems.length === 1 ? 'y' : 'ies'} could not be read
            </summary>
            <ul>
              {listing.problems.map(problem => (
                <li key={problem.entry}>
                  <code>{problem.entry}</code>: {problem.message}
                </li>
              ))}
            </ul>
          </details>
        ) : null}
      </details>
      <details className="jp-Workbench-section jp-Workbench-querySection">
        <summary>Query (SQL)</summary>
        <QuerySection selected={orderedRows} onResult={actions.showQuery} />
      </details>
      {dropping ? <div className="jp-Workbench-dropNote">Drop trace files to import them</div> : null}
    </div>
  );
}

/** The left sidebar widget. */
export class WorkbenchSidebar extends ReactWidget {
  constructor(private readonly _actions: ISidebarActions) {
    super();
    this.imports = new ImportTracker((runIds, open) => {
      this.refresh();
      if (open && runIds.length > 0) {
        this._actions.open(runIds);
      }
    });
    this.id = 'jp-workbench-sidebar';
    this.addClass('jp-Workbench-sidebar');
    this.title.icon = workbenchIcon;
    this.title.caption = 'Workbench: runs, captures, dashboards';
  }

  /** The panel's imports (uploads and files of the server's root folder). */
  readonly imports: ImportTracker;

  /** List the runs again. */
  refresh(): void {
    this._generation += 1;
    this.update();
  }

  /** Open the co-design section with `runId` as the run to project. */
  projectRun(runId: string): void {
    this._projectPreset = { run: runId, n: (this._projectPreset?.n ?? 0) + 1 };
    this.update();
  }

  /** Make the server read and capture into `path` ('' for its own default), then list the runs there. */
  async setTracesRoot(path: string): Promise<void> {
    try {
      await setTracesRoot(path);
      this._rootError = null;
    } catch (error) {
      this._rootError = `The traces folder setting "${path}" was not applied: ${message(error)}`;
    }
    this.refresh();
  }

  protected render(): JSX.Element {
    return (
      <WorkbenchPanel actions={this._actions} generation={this._generation} rootError={this._rootError}
        imports={this.imports} projectPreset={this._projectPreset} />
    );
  }

  private _generation = 0;
  private _rootError: string | null = null;
  private _projectPreset: IProjectPreset | null = null;
}
