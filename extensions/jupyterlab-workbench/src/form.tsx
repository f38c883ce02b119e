/**
 * What the sidebar's job forms (capture, serving, quantization) share: a labelled text field bound to a form's
 * values, a checkbox, the Run/Cancel buttons of a followed job, the status of a running job that reports no
 * progress of its own, and errors shown in place.
 *
 * A field's input has the id `jp-Workbench-<prefix>-<name>` (its error `...-error`), so each form's fields can be
 * found by name.
 */

import * as React from 'react';

import { IJob } from './api';

/** A form field that cannot become a request option; the message names the field. */
export class FormError extends Error {}

/** An error shown in place. */
export function ErrorNote(props: { text: string | null }): JSX.Element | null {
  if (!props.text) {
    return null;
  }
  return (
    <div className="jp-Workbench-error" role="alert">
      {props.text}
    </div>
  );
}

/** The bounds of a number field (a capture option's, or the server's limits). */
export interface IBounds {
  minimum: number | null;
  maximum: number | null;
}

export interface IFormFieldProps<F> {
  /** The form's name in the input's id: `jp-Workbench-<prefix>-<name>`. */
  prefix: string;
  name: keyof F & string;
  label: string;
  /** The form's values, as typed. */
  form: F;
  onChange: (name: keyof F & string, value: string) => void;
  type?: 'text' | 'number' | 'url';
  /** A number field's bounds. */
  bounds?: IBounds;
  /** Rows of a multi-line field (a text area); a one-line input without. */
  rows?: number;
  placeholder?: string;
  list?: string;
  title?: string;
  required?: boolean;
  /** Why its text is no value, shown under it as it is typed. */
  error?: string | null;
}

/** A labelled text (or number) field showing `form[name]`. */
export function FormField<F>(props: IFormFieldProps<F>): JSX.Element {
  const id = `jp-Workbench-${props.prefix}-${props.name}`;
  const number = props.type === 'number';
  const common = {
    id,
    name: props.name,
    className: 'jp-mod-styled',
    value: props.form[props.name] as unknown as string,
    placeholder: props.placeholder,
    title: props.title,
    spellCheck: false,
    'aria-required': props.required ? true : undefined,
    'aria-invalid': props.error ? true : undefined,
    'aria-describedby': props.error ? `${id}-error` : undefined
  };
  return (
    <div className="jp-Workbench-field">
      <label htmlFor={id}>{props.label}</label>
      {props.rows ? (
        <textarea {...common} rows={props.rows} onChange={event => props.onChange(props.name, event.target.value)} />
      ) : (
        <input
          {...common}
          type={props.type ?? 'text'}
          min={number ? (props.bounds?.minimum ?? 0) : undefined}
          max={number ? (props.bounds?.maximum ?? undefined) : undefined}
          list={props.list}
          onChange={event => props.onChange(props.name, event.target.value)}
        />
      )}
      {props.error ? (
        <div id={`${id}-error`} className="jp-Workbench-fieldError" role="alert">
          {props.error}
        </div>
      ) : null}
    </div>
  );
}

/** A labelled checkbox. */
export function CheckField(props: {
  id: string;
  label: string;
  checked: boolean;
  onChange: (checked: boolean) => void;
  title?: string;
}): JSX.Element {
  return (
    <div className="jp-Workbench-field jp-Workbench-check" title={props.title}>
      <input id={props.id} type="checkbox" checked={props.checked} onChange={event => props.onChange(event.target.checked)} />
      <label htmlFor={props.id}>{props.label}</label>
    </div>
  );
}

/** A job form's buttons: submit (`label`; disabled while a job runs or starts) and, while one runs, Cancel. */
export function JobButtons(props: {
  label: string;
  running: boolean;
  submitting: boolean;
  cancelling: boolean;
  onCancel: () => void;
}): JSX.Element {
  return (
    <div className="jp-Workbench-buttons">
      <button type="submit" className="jp-Button jp-mod-styled jp-mod-accept" disabled={props.running || props.submitting}>
        {props.submitting ? 'Starting…' : props.label}
      </button>
      {props.running ? (
        <button type="button" className="jp-Button jp-mod-styled jp-mod-warn" onClick={props.onCancel}
          disabled={props.cancelling}>
          {props.cancelling ? 'Cancelling…' : 'Cancel'}
        </button>
      ) : null}
    </div>
  );
}

/**
 * A queued or running job whose command reports no progress of its own (serving, quantization): its place in the
 * queue, or `label` (what it does) over an indeterminate bar, with its time so far and its log.
 */
export function RunningJob(props: { job: IJob; label: string; what: string }): JSX.Element {
  const { job } = props;
  const [now, setNow] = React.useState(() => Date.now());
  React.useEffect(() => {
    const timer = window.setInterval(() => setNow(Date.now()), 1000);
    return () => window.clearInterval(timer);
  }, []);
  if (job.status === 'queued') {
    return (
      <div className="jp-Workbench-progressLabel" role="status">
        Queued{job.queue_position ? ` (position ${job.queue_position})` : ''}
      </div>
    );
  }
  const started = job.started ? Date.parse(job.started) : NaN;
  const seconds = Number.isFinite(started) ? Math.max(0, Math.round((now - started) / 1000)) : null;
  return (
    <div className="jp-Workbench-progressBox">
      <div className="jp-Workbench-progressLabel" role="status">
        <span className="jp-Workbench-task">{props.label}</span>
        {seconds !== null ? <span className="jp-Workbench-elapsed">{` ${seconds} s`}</span> : null}
      </div>
      <div
        className="jp-Workbench-progress jp-mod-indeterminate"
        role="progressbar"
        aria-label={`${props.what} progress: ${props.label}`}
      >
        <div className="jp-Workbench-progressFill" />
      </div>
      <JobLog log={job.log} />
    </div>
  );
}

/** A job's log tail, folded (nothing when the job logged nothing). */
export function JobLog(props: { log: string[] }): JSX.Element | null {
  return props.log.length > 0 ? (
    <details>
      <summary>log</summary>
      <pre className="jp-Workbench-log">{props.log.join('\n')}</pre>
    </details>
  ) : null;
}
