/**
 * The query box of the Workbench sidebar: one read-only SQL SELECT over the selected runs (every run when none
 * is selected), answered by `POST query` (`workbench query` on the server), its rows shown as a table.
 * Tables and examples: docs/sql.md. Every value is rendered as React text.
 */

import * as React from 'react';

import { IQueryResult, runQuery } from './api';
import { ErrorNote } from './capture';

/** What the box holds at first: the kernels that took the most time. */
export const EXAMPLE_QUERY =
  "SELECT name, count(*) AS calls, sum(dur_ns) / 1e6 AS ms\nFROM events WHERE kind = 'kernel'\n" +
  'GROUP BY name ORDER BY ms DESC LIMIT 20';

/** Most rows the panel asks for. */
export const QUERY_LIMIT = 1000;

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

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The result of a query as a table. */
export function ResultTable(props: { result: IQueryResult }): JSX.Element {
  const { result } = props;
  const numeric = result.types.map(type => /int|float|double|decimal/.test(type));
  return (
    <div className="jp-Workbench-queryResult">
      <div className="jp-Workbench-queryCount" role="status">
        {result.rows.length} row{result.rows.length === 1 ? '' : 's'}
        {result.truncated ? ` (the first ${result.rows.length}; there are more)` : ''}
      </div>
      <div className="jp-Workbench-queryScroll">
        <table className="jp-Workbench-queryTable">
          <thead>
            <tr>
              {result.columns.map((column, i) => (
                <th key={i}>{column}</th>
              ))}
            </tr>
          </thead>
          <tbody>
            {result.rows.map((row, r) => (
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

/** The query box over `runIds` (every run when empty). */
export function QuerySection(props: { runIds: string[] }): JSX.Element {
  const [sql, setSql] = React.useState(EXAMPLE_QUERY);
  const [result, setResult] = React.useState<IQueryResult | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const [running, setRunning] = React.useState(false);

  const run = async () => {
    setRunning(true);
    setError(null);
    try {
      setResult(await runQuery(sql, props.runIds.length > 0 ? props.runIds : null, QUERY_LIMIT));
    } catch (err) {
      setResult(null);
      setError(message(err));
    } finally {
      setRunning(false);
    }
  };

  const scope = props.runIds.length > 0
    ? `${props.runIds.length} selected run${props.runIds.length === 1 ? '' : 's'}`
    : 'every run';
  return (
    <section className="jp-Workbench-query" aria-label="Query">
      <textarea
        className="jp-mod-styled jp-Workbench-queryText"
        aria-label="SQL query"
        spellCheck={false}
        rows={4}
        value={sql}
        onChange={event => setSql(event.target.value)}
        onKeyDown={event => {
          if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) {
            event.preventDefault();
            void run();
          }
        }}
        title="One SELECT over the tables events, memory, counters, kernel_metrics and runs (each with a run column); Ctrl+Enter runs it"
      />
      <div className="jp-Workbench-buttons">
        <button
          className="jp-Button jp-mod-styled jp-mod-accept"
          onClick={() => void run()}
          disabled={running || sql.trim() === ''}
        >
          {running ? 'Running…' : 'Run query'}
        </button>
        <span className="jp-Workbench-queryScope">over {scope}</span>
      </div>
      <ErrorNote text={error} />
      {result ? <ResultTable result={result} /> : null}
    </section>
  );
}
