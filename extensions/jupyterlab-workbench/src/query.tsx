/**
 * The query box of the Workbench sidebar: one read-only SQL SELECT over the selected runs (every run when none
 * is selected; the box names them), answered by `POST query` (`workbench query` on the server). Its rows open in
 * the main area (`queryView.tsx`), where every column has room. Tables and examples: docs/sql.md.
 */

import * as React from 'react';

import { IRunRow, runQuery } from './api';
import { ErrorNote } from './form';
import { errorMessage } from './job';
import { IQueryShown } from './queryView';
import { runLabel } from './runs';

/** What the box holds at first: the kernels that took the most time. */
export const EXAMPLE_QUERY =
  "SELECT name, count(*) AS calls, sum(dur_ns) / 1e6 AS ms\nFROM events WHERE kind = 'kernel'\n" +
  'GROUP BY name ORDER BY ms DESC LIMIT 20';

/** Most rows the panel asks for. */
export const QUERY_LIMIT = 1000;

/** Most selected runs named under the box; the rest are counted. */
const NAMED_SELECTED = 4;

/** What the query will run over, in words: the selected runs by name, or every run. */
export function queryScope(selected: IRunRow[]): string {
  if (selected.length === 0) {
    return 'every run';
  }
  const names = selected.slice(0, NAMED_SELECTED).map(row => runLabel(row, row.run));
  const more = selected.length - names.length;
  return `the ${selected.length} selected run${selected.length === 1 ? '' : 's'}: ${names.join(', ')}` +
    (more > 0 ? ` and ${more} more` : '');
}

/** The query box over the `selected` runs (every run when none); `onResult` shows a result in the main area. */
export function QuerySection(props: { selected: IRunRow[]; onResult: (shown: IQueryShown) => void }): JSX.Element {
  const [sql, setSql] = React.useState(EXAMPLE_QUERY);
  const [status, setStatus] = React.useState<string | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const [running, setRunning] = React.useState(false);
  const ids = props.selected.map(row => row.run);

  const run = async () => {
    setRunning(true);
    setError(null);
    setStatus(null);
    try {
      const result = await runQuery(sql, ids.length > 0 ? ids : null, QUERY_LIMIT);
      props.onResult({ result, sql, scope: ids.length > 0 ? 'the selected runs' : 'every run' });
      setStatus(`${result.rows.length}${result.truncated ? '+' : ''} row${result.rows.length === 1 ? '' : 's'} ` +
        `over ${result.runs.length} run${result.runs.length === 1 ? '' : 's'}: shown in the main area`);
    } catch (err) {
      setError(errorMessage(err));
    } finally {
      setRunning(false);
    }
  };

  const scope = queryScope(props.selected);
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
      </div>
      <div className="jp-Workbench-queryScope" title={props.selected.map(row => runLabel(row, row.run)).join('\n')}>
        Over {scope} (select runs in the list above to narrow it)
      </div>
      <ErrorNote text={error} />
      {status ? <div className="jp-Workbench-queryCount" role="status">{status}</div> : null}
    </section>
  );
}
