/**
 * The serving form of the Workbench sidebar: a serving run against a running OpenAI-compatible server, and the
 * live status of its job.
 *
 * The form becomes a `POST serve` body (`workbench serve --url`: NVIDIA AIPerf drives the server at one load
 * or a sweep of rates or concurrencies, one run per load point). The job is followed (`job.ts`: polled every
 * `POLL_MS`) until it ends, with a cancel button; `workbench serve` reports no progress of its own, so the job
 * shows its load and its log. Once it ends, its runs are listed (a click opens a run's dashboard, whose serving tab shows the
 * requests); a run whose requests failed is still kept and listed, with the failures counted.
 */

import * as React from 'react';

import { IJob, IServePoint, IServeRequest, IServeResult, isServeJob, startServe } from './api';
import { ErrorNote, FormError, FormField, JobButtons, RunningJob } from './form';
import { useFollowedJob } from './job';

/** The server's bounds (`serve_handlers.py`), checked here first so a mistake shows at once. */
export const MAX_REQUESTS = 10_000;
export const MAX_POINTS = 16;
export const MAX_TOKENS = 32_768;

/** The form's fields, as typed (text), before they are checked. */
export interface IServeForm {
  url: string;
  tokenizer: string;
  model: string;
  /** Open loop (requests per second) or closed loop (requests in flight). */
  load: 'rate' | 'concurrency';
  /** The loads, comma-separated: one load point each. */
  loads: string;
  requests: string;
  isl: string;
  osl: string;
  slo: string;
}

export const DEFAULT_SERVE_FORM: IServeForm = {
  url: '',
  tokenizer: '',
  model: '',
  load: 'rate',
  loads: '4',
  requests: '32',
  isl: '64',
  osl: '16',
  slo: ''
};

function wholeNumber(name: string, text: string, maximum: number): number {
  const value = text.trim();
  if (value === '') {
    throw new FormError(`${name}: required`);
  }
  const number = Number(value);
  if (!/^\d+$/.test(value) || number < 1 || number > maximum) {
    throw new FormError(`${name}: expected a whole number from 1 to ${maximum.toLocaleString('en-US')}, got "${value}"`);
  }
  return number;
}

/** The loads typed as `1,2,4` (commas or spaces between them): positive numbers, whole ones for concurrency. */
export function parseLoads(text: string, load: IServeForm['load']): number[] {
  const name = load === 'rate' ? 'rates' : 'concurrency';
  const words = text.split(/[\s,]+/).filter(word => word !== '');
  if (words.length === 0 || words.length > MAX_POINTS) {
    throw new FormError(`${name}: give 1 to ${MAX_POINTS} loads, e.g. ${load === 'rate' ? '1,2,4' : '1,4,16'}`);
  }
  const values = words.map(word => {
    const number = Number(word);
    const whole = /^\d+$/.test(word);
    if (!Number.isFinite(number) || number <= 0 || (load === 'concurrency' && !whole)) {
      throw new FormError(
        `${name}: "${word}" is not ${load === 'rate' ? 'a number of requests per second above 0' : 'a whole number of requests in flight'}`
      );
    }
    return number;
  });
  if (new Set(values).size < values.length) {
    throw new FormError(`${name}: a load is named more than once`);
  }
  return values;
}

/** The `POST serve` body the form describes; a `FormError` names the first field that is wrong. */
export function serveRequest(form: IServeForm): IServeRequest {
  const url = form.url.trim();
  if (!/^https?:\/\/[^\s/]+/i.test(url)) {
    throw new FormError('URL: the http(s) URL of a running OpenAI-compatible server, e.g. http://127.0.0.1:8000');
  }
  const tokenizer = form.tokenizer.trim();
  if (tokenizer === '') {
    throw new FormError("tokenizer: required (a tokenizer folder, relative to the server's root folder)");
  }
  const request: IServeRequest = {
    url,
    tokenizer,
    requests: wholeNumber('requests', form.requests, MAX_REQUESTS),
    isl: wholeNumber('ISL', form.isl, MAX_TOKENS),
    osl: wholeNumber('OSL', form.osl, MAX_TOKENS)
  };
  request[form.load] = parseLoads(form.loads, form.load);
  const model = form.model.trim();
  if (model !== '') {
    request.model = model;
  }
  const slo = form.slo.trim();
  if (slo !== '') {
    request.slo = slo;
  }
  return request;
}

/** The form that describes `request` (a job's, e.g. one still running when the page was loaded). */
export function serveFormFromRequest(request: IServeRequest): IServeForm {
  const load = Array.isArray(request.concurrency) ? 'concurrency' : 'rate';
  const text = (value: unknown, fallback: string): string =>
    value === null || value === undefined ? fallback : String(value);
  return {
    url: text(request.url, ''),
    tokenizer: text(request.tokenizer, ''),
    model: text(request.model, ''),
    load,
    loads: (request[load] ?? []).join(','),
    requests: text(request.requests, DEFAULT_SERVE_FORM.requests),
    isl: text(request.isl, DEFAULT_SERVE_FORM.isl),
    osl: text(request.osl, DEFAULT_SERVE_FORM.osl),
    slo: text(request.slo, '')
  };
}

/** What a serving job is doing, in a few words: `rate 1, 2 req/s · 32 requests each`. */
export function loadLabel(request: IServeRequest): string {
  const rates = request.rate ?? [];
  const loads = rates.length > 0 ? `rate ${rates.join(', ')} req/s` : `concurrency ${(request.concurrency ?? []).join(', ')}`;
  const points = (request.rate ?? request.concurrency ?? []).length;
  return `${loads} · ${request.requests} request${request.requests === 1 ? '' : 's'}${points > 1 ? ' each' : ''}`;
}

/** One line of a finished serving job: what it served, or why it did not. */
export function serveOutcome(job: IJob): string {
  const points = (job.result as IServeResult | null)?.runs ?? [];
  if (job.status === 'cancelled') {
    return 'Serving run cancelled: nothing was kept.';
  }
  if (points.length === 0) {
    return job.status === 'succeeded' ? 'Serving run ended with no runs' : `Serving run failed: ${job.error ?? 'see the log'}`;
  }
  const runs = points.filter(point => point.run).length;
  const sent = points.reduce((sum, point) => sum + (point.summary?.requests ?? 0), 0);
  const failed = points.reduce((sum, point) => sum + (point.summary?.failed ?? 0), 0);
  const experiment = (job.result as IServeResult).experiment;
  const kept = `${runs} run${runs === 1 ? '' : 's'}` + (experiment ? ` (experiment ${experiment})` : '');
  if (job.status === 'succeeded') {
    return `Served ${points.length} load point${points.length === 1 ? '' : 's'}: ${kept}`;
  }
  const why = [
    failed > 0 ? `${failed} of ${sent} requests failed` : null,
    points.some(point => !point.run) ? `${points.filter(point => !point.run).length} load point(s) failed` : null
  ].filter(part => part !== null);
  return `Serving run ended with failures (${why.join('; ') || job.error || 'see the log'}): ${kept} kept`;
}

/** A point's figures for its line: `2 ok, 1 failed`. */
function pointFigures(point: IServePoint): string {
  const summary = point.summary;
  if (!summary) {
    return point.error ?? 'failed';
  }
  return `${summary.ok ?? 0} ok, ${summary.failed ?? 0} failed`;
}

/** A finished serving job: its outcome, its runs (a click opens one's dashboard), warnings and log. */
function Outcome(props: { job: IJob; onOpen: (runIds: string[]) => void; onDismiss: () => void }): JSX.Element {
  const { job } = props;
  const points = (job.result as IServeResult | null)?.runs ?? [];
  const notes = [
    ...points.flatMap(point => point.warnings.map(warning => `${point.load}: ${warning}`)),
    ...job.log
  ];
  return (
    <div
      className={`jp-Workbench-outcome jp-Workbench-serveOutcome jp-mod-${job.status}`}
      role={job.status === 'failed' ? 'alert' : 'status'}
    >
      <span className="jp-Workbench-outcomeText">{serveOutcome(job)}</span>
      <button className="jp-Workbench-linkButton" onClick={props.onDismiss} title="Dismiss" aria-label="Dismiss">
        ✕
      </button>
      {points.length > 0 ? (
        <ul className="jp-Workbench-imports jp-Workbench-serveRuns" aria-label="Serving runs">
          {points.map(point => (
            <li
              key={point.load}
              className={`jp-Workbench-import jp-mod-${point.run && !point.summary?.failed ? 'done' : 'failed'}`}
              data-run={point.run ?? undefined}
            >
              {point.run ? (
                <button
                  className="jp-Workbench-runName"
                  onClick={() => props.onOpen([point.run!])}
                  title={`Open the dashboard of ${point.run}`}
                >
                  {point.load}
                </button>
              ) : (
                <span>{point.load}</span>
              )}
              <span className="jp-Workbench-importText">{pointFigures(point)}</span>
            </li>
          ))}
        </ul>
      ) : null}
      {notes.length > 0 && job.status !== 'cancelled' ? (
        <details>
          <summary>{points.some(point => point.warnings.length > 0) ? 'warnings and log' : 'log'}</summary>
          <pre className="jp-Workbench-log">{notes.join('\n')}</pre>
        </details>
      ) : null}
    </div>
  );
}

/**
 * The serving form with its job. `onFinished` runs once when a job it follows ends; `onOpen` opens runs.
 */
export function ServeSection(props: {
  onFinished: (job: IJob) => void;
  onOpen: (runIds: string[]) => void;
}): JSX.Element {
  const [form, setForm] = React.useState<IServeForm>(DEFAULT_SERVE_FORM);
  const { job, running, error, submitting, cancelling, dismiss, submit: follow, cancel } = useFollowedJob({
    what: 'the serving run',
    isMine: isServeJob,
    onResume: live => {
      if (isServeJob(live)) {
        setForm(serveFormFromRequest(live.request.serve));
      }
    },
    onFinished: props.onFinished
  });
  const change = (name: keyof IServeForm, value: string) => setForm(current => ({ ...current, [name]: value }));

  const submit = (event: React.FormEvent) => {
    event.preventDefault();
    void follow(() => serveRequest(form), startServe);
  };

  const rate = form.load === 'rate';
  return (
    <section className="jp-Workbench-serve" aria-label="Serving">
      <form onSubmit={submit} noValidate>
        <FormField prefix="serve" label="Server URL" name="url" type="url" form={form} onChange={change} required
          placeholder="http://127.0.0.1:8000"
          title="A running OpenAI-compatible server (vLLM, SGLang, TensorRT-LLM...): the workbench attaches to it" />
        <FormField prefix="serve" label="Tokenizer folder" name="tokenizer" form={form} onChange={change} required
          placeholder="models/my-model"
          title="The served model's tokenizer (a save_pretrained folder), relative to the server's root folder: AIPerf counts prompt tokens with it" />
        <FormField prefix="serve" label="Model" name="model" form={form} onChange={change} placeholder="the first it serves"
          title="The served model's name, as GET /v1/models lists it" />
        <div className="jp-Workbench-fieldRow">
          <div className="jp-Workbench-field">
            <label htmlFor="jp-Workbench-serve-load">Load</label>
            <select
              id="jp-Workbench-serve-load"
              name="load"
              className="jp-mod-styled"
              value={form.load}
              onChange={event => change('load', event.target.value)}
            >
              <option value="rate">rate (req/s)</option>
              <option value="concurrency">concurrency</option>
            </select>
          </div>
          <FormField prefix="serve" label={rate ? 'Rates' : 'In flight'} name="loads" form={form} onChange={change} required
            placeholder={rate ? '1,2,4' : '1,4,16'}
            title={rate
              ? 'Open loop: requests per second; several (1,2,4) make a sweep, one run per load point'
              : 'Closed loop: requests in flight; several (1,4,16) make a sweep, one run per load point'} />
        </div>
        <div className="jp-Workbench-fieldRow">
          <FormField prefix="serve" label="Requests" name="requests" type="number" bounds={{ minimum: 1, maximum: MAX_REQUESTS }} form={form} onChange={change}
            required title="Requests per load point" />
          <FormField prefix="serve" label="ISL" name="isl" type="number" bounds={{ minimum: 1, maximum: MAX_TOKENS }} form={form} onChange={change} required
            title="Input sequence length: prompt tokens per request" />
          <FormField prefix="serve" label="OSL" name="osl" type="number" bounds={{ minimum: 1, maximum: MAX_TOKENS }} form={form} onChange={change} required
            title="Output sequence length: tokens generated per request" />
        </div>
        <FormField prefix="serve" label="SLO" name="slo" form={form} onChange={change} placeholder="ttft=200ms,tpot=50ms"
          title="Service-level objectives for goodput (ttft, tpot, itl, e2e; ns, us, ms or s); optional" />
        <JobButtons label="Start" running={running} submitting={submitting} cancelling={cancelling} onCancel={cancel} />
      </form>
      <ErrorNote text={error} />
      {job && running ? (
        <RunningJob job={job} what="serving" label={isServeJob(job) ? loadLabel(job.request.serve) : 'serving'} />
      ) : null}
      {job && !running ? <Outcome job={job} onOpen={props.onOpen} onDismiss={dismiss} /> : null}
    </section>
  );
}
