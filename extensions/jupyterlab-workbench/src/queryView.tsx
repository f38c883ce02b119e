/**
 * The result of a SQL query in the main area: the runs it covered, named above it; its row count (and whether the
 * limit cut it); a table of every column (it scrolls sideways) sorted by a click on a column's header (numbers by
 * value, nulls last); and a CSV download of its rows as shown. Every value is rendered as React text, never as HTML.
 */

import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { IQueryResult } from './api';
import { runLabel } from './runs';

/** Most covered runs named in the line above the table; the rest are counted (and listed in its tooltip). */
export const NAMED_RUNS = 12;

/** The name of the downloaded file. */
export const CSV_FILE = 'workbench-query.csv';

/** A result cell as text: numbers with up to four decimals, `—` for null. */
export function cellText(value: unknown): string {
  if (value === null || value === undefined) {
    return '—';
  }
  if (typeof value === 'number') {
    return Number.isInteger(value) ? value.toLocaleString('en-US') : value.toLocaleString('en-US', {
      maximumFractionDigits: 4
    });
  }
  return typeof value === 'object' ? JSON.stringify(value) : String(value);
}

/** Whether an Arrow type name (`int64`, `double`, `decimal128(18, 3)`...) is a number's. */
export function isNumericType(type: string): boolean {
  return /int|float|double|decimal/.test(type);
}

/** The column the table is sorted by, and its direction; null: the query's own order. */
export type SortOrder = { column: number; descending: boolean } | null;

/** The order of two cells ascending: nulls last, numbers by value, anything else by its text. */
export function compareCells(a: unknown, b: unknown): number {
  const aNull = a === null || a === undefined;
  const bNull = b === null || b === undefined;
  if (aNull || bNull) {
    return aNull === bNull ? 0 : aNull ? 1 : -1;
  }
  if (typeof a === 'number' && typeof b === 'number') {
    return a - b;
  }
  return cellText(a).localeCompare(cellText(b));
}

/** `rows` in `sort`'s order (stable: equal cells keep the query's order; nulls last either way). */
export function sortedRows(rows: unknown[][], sort: SortOrder): unknown[][] {
  if (sort === null) {
    return rows;
  }
  const { column, descending } = sort;
  return rows
    .map((row, index) => ({ row, index }))
    .sort((x, y) => {
      const a = x.row[column];
      const b = y.row[column];
      const nulls = (a === null || a === undefined) !== (b === null || b === undefined);
      const order = compareCells(a, b);
      return (descending && !nulls ? -order : order) || x.index - y.index;
    })
    .map(item => item.row);
}

/**
 * One CSV field (RFC 4180): null as empty, objects as JSON; quoted when it holds a quote, comma, line break or edge
 * space. A text value a spreadsheet would run as a formula (a trace name starting with =, +, -, @) gets a leading
 * apostrophe, so opening the file runs nothing.
 */
export function csvField(value: unknown): string {
  let text =
    value === null || value === undefined ? '' : typeof value === 'object' ? JSON.stringify(value) : String(value);
  if (typeof value === 'string' && /^[=+\-@\t\r]/.test(text)) {
    text = `'${text}`;
  }
  return /[",\r\n]|^\s|\s$/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

/** The header and `rows` as CSV, lines ended by CRLF. */
export function toCsv(columns: string[], rows: unknown[][]): string {
  return [columns, ...rows].map(row => row.map(csvField).join(',')).join('\r\n') + '\r\n';
}

/** Save `text` as the file `name` from the browser (a Blob behind a temporary link). */
function download(text: string, name: string): void {
  const url = URL.createObjectURL(new Blob([text], { type: 'text/csv;charset=utf-8' }));
  const link = document.createElement('a');
  link.href = url;
  link.download = name;
  document.body.appendChild(link);
  link.click();
  link.remove();
  window.setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** The line naming the runs a query covered. */
function CoveredRuns(props: { result: IQueryResult; scope: string }): JSX.Element {
  const labels = props.result.runs.map(row => runLabel(row, row.run));
  const shown = props.result.runs.slice(0, NAMED_RUNS);
  const more = props.result.runs.length - shown.length;
  return (
    <div className="jp-Workbench-queryRuns" title={labels.join('\n')}>
      <span className="jp-Workbench-queryRunsLead">
        Over {props.scope} ({props.result.runs.length} run{props.result.runs.length === 1 ? '' : 's'}):
      </span>{' '}
      {shown.map((row, i) => (
        <span key={row.run} className="jp-Workbench-queryRun" data-run={row.run} title={`run ${row.run}`}>
          {labels[i]}
        </span>
      ))}
      {more > 0 ? <span className="jp-Workbench-queryMore"> and {more} more</span> : null}
    </div>
  );
}

/** The result table, sortable by its headers. */
export function SortableTable(props: { result: IQueryResult }): JSX.Element {
  const { result } = props;
  const [sort, setSort] = React.useState<SortOrder>(null);
  const numeric = result.types.map(isNumericType);
  const rows = React.useMemo(() => sortedRows(result.rows, sort), [result, sort]);
  const sortBy = (column: number) =>
    setSort(current =>
      current?.column === column ? { column, descending: !current.descending } : { column, descending: numeric[column] }
    );
  return (
    <div className="jp-Workbench-queryView-body">
      <div className="jp-Workbench-queryBar">
        <span className="jp-Workbench-queryCount" role="status">
          {result.rows.length} row{result.rows.length === 1 ? '' : 's'}
          {result.truncated ? ` (the first ${result.rows.length}: the query has more; add a LIMIT or narrow it)` : ''}
          {' · '}
          {result.columns.length} column{result.columns.length === 1 ? '' : 's'}
        </span>
        <button
          className="jp-Button jp-mod-styled jp-Workbench-download"
          onClick={() => download(toCsv(result.columns, rows), CSV_FILE)}
          title="Download the rows as shown (in this order) as a CSV file"
        >
          Download CSV
        </button>
      </div>
      <div className="jp-Workbench-queryScroll">
        <table className="jp-Workbench-queryTable">
          <thead>
            <tr>
              {result.columns.map((column, i) => {
                const sorted = sort?.column === i;
                return (
                  <th
                    key={i}
                    className={numeric[i] ? 'jp-mod-number' : undefined}
                    aria-sort={sorted ? (sort!.descending ? 'descending' : 'ascending') : 'none'}
                  >
                    <button
                      className="jp-Workbench-sortButton"
                      onClick={() => sortBy(i)}
                      title={`${column} (${result.types[i]}): click to sort`}
                    >
                      {column}
                      <span className="jp-Workbench-sortMark" aria-hidden="true">
                        {sorted ? (sort!.descending ? ' ▼' : ' ▲') : ''}
                      </span>
                    </button>
                  </th>
                );
              })}
            </tr>
          </thead>
          <tbody>
            {rows.map((row, r) => (
              <tr key={r}>
                {row.map((value, c) => (
                  <td key={c} className={numeric[c] ? 'jp-mod-number' : undefined} title={cellText(value)}>
                    {cellText(value)}
                  </td>
                ))}
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </div>
  );
}

/** What the view shows: a query's result, its text and what it ran over. */
export interface IQueryShown {
  result: IQueryResult;
  sql: string;
  /** "every run" or "the selected runs". */
  scope: string;
}

/** The main-area widget of the latest query's result (the sidebar's query box fills it). */
export class QueryResultView extends ReactWidget {
  constructor() {
    super();
    this.addClass('jp-Workbench-queryView');
  }

  /** Show `shown` in place of the previous result (its sort order reset). */
  setResult(shown: IQueryShown): void {
    this._shown = shown;
    this._count += 1;
    this.update();
  }

  protected render(): JSX.Element | null {
    const shown = this._shown;
    if (shown === null) {
      return null;
    }
    return (
      <div className="jp-Workbench-queryView-inner">
        <CoveredRuns result={shown.result} scope={shown.scope} />
        <details className="jp-Workbench-querySql">
          <summary>SQL</summary>
          <pre>{shown.sql}</pre>
        </details>
        <SortableTable key={this._count} result={shown.result} />
      </div>
    );
  }

  private _shown: IQueryShown | null = null;
  private _count = 0;
}
