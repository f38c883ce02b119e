/**
 * The runs of the Workbench sidebar: grouped by experiment (newest first) with their key figures
 * (variant, device, status, median latency), multi-select, and the open / compare / delete actions.
 *
 * Every name that comes from a run or a trace is rendered as React text, never as HTML.
 */

import * as React from 'react';

import { IExperiment, IListing, IRunRow } from './api';

/** A group of runs in the list: one experiment, or the runs that belong to none. */
export interface IRunGroup {
  key: string;
  title: string;
  detail: string;
  runs: IRunRow[];
}

/** `created` (ISO 8601, UTC) as "YYYY-MM-DD HH:MM", or '' when absent. */
export function shortTime(created: string | null | undefined): string {
  if (!created) {
    return '';
  }
  return created.replace('T', ' ').slice(0, 16);
}

/**
 * How a run is named in the list: its display name from the server (a sweep's label with the sizes it ran at,
 * `eager-b8-s128`; the variant; an import's file less its suffix), else its variant, file or id.
 */
export function runName(row: IRunRow): string {
  return row.name || row.variant || row.file || row.run;
}

/**
 * How a run is named in a tab and above a query's rows: model and name, with the batch when the name does not
 * carry it (`tiny-gpt · eager · b4`, `tiny-gpt · eager-b8`); an import's name; else its id.
 */
export function runLabel(row: IRunRow | undefined, runId: string): string {
  if (!row) {
    return runId;
  }
  const name = runName(row);
  if (!row.model) {
    return name;
  }
  const sized = !!row.name && row.name !== row.variant; // a sweep's label names its sizes
  return [row.model, name, !sized && row.batch ? `b${row.batch}` : null]
    .filter((part): part is string => !!part)
    .join(' · ');
}

/** A run's tooltip: its full name and id, what ran (model, variant, batch, sequence) or the file it came from, where. */
export function runTooltip(row: IRunRow): string {
  const sizes = [row.batch ? `batch ${row.batch}` : '', row.seq ? `sequence ${row.seq}` : ''].filter(s => s !== '');
  const what = row.file
    ? `imported from ${row.file}`
    : [row.model, row.variant, ...sizes].filter(part => !!part).join(' · ');
  return [runName(row), `run ${row.run}`, `${what} on ${row.device ?? '?'}`].join('\n');
}

/** A median latency for the list: three significant digits. */
export function formatMs(ms: number | null): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) {
    return '–';
  }
  return `${ms >= 100 ? ms.toFixed(0) : ms.toPrecision(3)} ms`;
}

/**
 * The runs of `listing` by experiment, newest experiment first, each in the experiment's own order;
 * runs of no (listed) experiment come last, as "Other runs". Experiments whose runs are all gone are left out.
 */
export function groupRuns(listing: IListing): IRunGroup[] {
  const byId = new Map(listing.runs.map(row => [row.run, row]));
  const placed = new Set<string>();
  const experiments = [...listing.experiments].sort((a: IExperiment, b: IExperiment) =>
    (b.created ?? '').localeCompare(a.created ?? '')
  );
  const groups: IRunGroup[] = [];
  for (const experiment of experiments) {
    const runs = experiment.runs
      .map(id => byId.get(id))
      .filter((row): row is IRunRow => row !== undefined && !placed.has(row.run));
    runs.forEach(row => placed.add(row.run));
    if (runs.length > 0) {
      const parts = [shortTime(experiment.created)];
      if (experiment.reference) {
        parts.push(`reference ${experiment.reference}`);
      }
      groups.push({
        key: `experiment:${experiment.experiment}`,
        title: experiment.model ?? experiment.experiment,
        detail: parts.filter(p => p !== '').join(' · '),
        runs
      });
    }
  }
  const others = listing.runs.filter(row => !placed.has(row.run)).reverse();
  if (others.length > 0) {
    groups.push({ key: 'other', title: 'Other runs', detail: 'imported or without an experiment', runs: others });
  }
  return groups;
}

interface IRunsProps {
  listing: IListing;
  selected: Set<string>;
  onSelect: (runIds: string[], selected: boolean) => void;
  onOpen: (runIds: string[]) => void;
}

function RunItem(props: IRunsProps & { row: IRunRow }): JSX.Element {
  const { row } = props;
  const checked = props.selected.has(row.run);
  const status = row.status ?? 'unknown';
  return (
    <li className={'jp-Workbench-run' + (checked ? ' jp-mod-selected' : '')} data-run={row.run} title={runTooltip(row)}>
      <input
        type="checkbox"
        checked={checked}
        aria-label={`select run ${row.run}`}
        onChange={event => props.onSelect([row.run], event.target.checked)}
      />
      <button
        className="jp-Workbench-runName"
        onClick={() => props.onOpen([row.run])}
        title={`${runTooltip(row)}\nClick to open its dashboard`}
      >
        {runName(row)}
      </button>
      <span className="jp-Workbench-device">{row.device ?? ''}</span>
      <span className={`jp-Workbench-status jp-mod-${status === 'ok' ? 'ok' : 'bad'}`}>{status}</span>
      <span className="jp-Workbench-p50" title={row.noise ? `median latency; noisy: ${row.noise}` : 'median latency'}>
        {formatMs(row.p50_ms)}
        {row.noise ? <span className="jp-Workbench-noisy" aria-label={`noisy: ${row.noise}`}> ⚠</span> : null}
      </span>
    </li>
  );
}

function GroupItem(props: IRunsProps & { group: IRunGroup }): JSX.Element {
  const { group } = props;
  const ids = group.runs.map(row => row.run);
  const all = ids.every(id => props.selected.has(id));
  return (
    <li className="jp-Workbench-group" data-group={group.key}>
      <div className="jp-Workbench-groupHeader">
        <input
          type="checkbox"
          checked={all}
          aria-label={`select all runs of ${group.title}`}
          onChange={event => props.onSelect(ids, event.target.checked)}
        />
        <span className="jp-Workbench-groupTitle">{group.title}</span>
        <span className="jp-Workbench-groupDetail" title={group.detail}>
          {group.detail}
        </span>
      </div>
      <ul className="jp-Workbench-runs">
        {group.runs.map(row => (
          <RunItem key={row.run} row={row} {...props} />
        ))}
      </ul>
    </li>
  );
}

/** The grouped run list. */
export function RunList(props: IRunsProps): JSX.Element {
  const groups = groupRuns(props.listing);
  if (groups.length === 0) {
    return (
      <p className="jp-Workbench-empty">
        No runs yet in this traces folder: capture one above, or use{' '}
        <code>workbench capture</code> / <code>workbench import</code> in a terminal.
      </p>
    );
  }
  return (
    <ul className="jp-Workbench-groups" aria-label="Runs">
      {groups.map(group => (
        <GroupItem key={group.key} group={group} {...props} />
      ))}
    </ul>
  );
}
