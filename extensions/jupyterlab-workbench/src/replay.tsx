/**
 * The op replay of a run, in a main-area tab of its own (`workbench replay`): the run's top ops by self time rebuilt
 * from the shapes, dtypes, strides and scalars its trace recorded, and each timed alone under the variants chosen,
 * beside the trace's time and its roofline position; ops that cannot be rebuilt are listed with the reason.
 *
 * The tab holds a small form (how many ops, which variants) that becomes a `POST replay` body; its job is followed
 * (`job.ts`) with its time and log (`workbench replay` reports no progress of its own), and once it succeeded the
 * replay's chart and table draw below the form (`GET replay/<job>/view`, at the tab's width). A run recorded without
 * shapes fails with the replay's own message saying so. The tab is reached from a run: its dashboard's toolbar, or
 * the runs list with one run selected.
 */

import { ReactWidget } from '@jupyterlab/ui-components';
import { Panel } from '@lumino/widgets';
import * as React from 'react';

import { IJob, IReplayRequest, IReplayResult, isReplayJob, startReplay } from './api';
import { CheckField, ErrorNote, FormError, FormField, JobButtons, JobLog, RunningJob } from './form';
import { useFollowedJob } from './job';
import { BokehView, replaySource } from './view';

/** The server's bound on `top` (`MAX_TOP` in replay_handlers.py), checked here first so a mistake shows at once. */
export const MAX_TOP = 100;
/** The variants a replay times, in the replay's order (`workbench.replay.table.VARIANTS`). */
export const REPLAY_VARIANTS = ['eager', 'bf16', 'compile'] as const;
export type ReplayVariant = (typeof REPLAY_VARIANTS)[number];

const VARIANT_TITLES: { [variant in ReplayVariant]: string } = {
  eager: 'The call as recorded',
  bf16: 'Its fp32/fp16 tensors in bfloat16',
  compile: 'torch.compile of the single call (compiling takes a while, and is not timed)'
};

/** The form's values, as typed. */
export interface IReplayForm {
  /** How many op signatures, as typed. */
  top: string;
  variants: ReplayVariant[];
}

export const DEFAULT_REPLAY_FORM: IReplayForm = { top: '20', variants: [...REPLAY_VARIANTS] };

/** The `POST replay` body the form describes for `run`; a `FormError` names the first field that is wrong. */
export function replayRequest(run: string, form: IReplayForm): IReplayRequest {
  const text = form.top.trim();
  const top = Number(text);
  if (!/^[0-9]+$/.test(text) || top < 1 || top > MAX_TOP) {
    throw new FormError(`top ops: a whole number from 1 to ${MAX_TOP}, got "${form.top}"`);
  }
  const variants = REPLAY_VARIANTS.filter(variant => form.variants.includes(variant));
  if (variants.length === 0) {
    throw new FormError('variants: choose at least one');
  }
  return { run, top, variants };
}

/** The form that describes `request` (a job's, e.g. one still running when the page was loaded). */
export function replayFormFromRequest(request: IReplayRequest): IReplayForm {
  return {
    top: String(request.top ?? DEFAULT_REPLAY_FORM.top),
    variants: REPLAY_VARIANTS.filter(variant => (request.variants ?? REPLAY_VARIANTS).includes(variant))
  };
}

/** What a replay job does, in a few words: `replaying the top 20 ops: eager, bf16`. */
export function replayLabel(request: IReplayRequest): string {
  const variants = (request.variants ?? REPLAY_VARIANTS).join(', ');
  return `replaying the top ${request.top ?? DEFAULT_REPLAY_FORM.top} ops: ${variants}`;
}

/** One line of a finished replay job: how many signatures it replayed, or why it did not. */
export function replayOutcome(job: IJob): string {
  if (job.status === 'cancelled') {
    return 'Replay cancelled.';
  }
  const result = job.result as IReplayResult | null;
  if (job.status !== 'succeeded' || !result) {
    return `Replay failed: ${job.error ?? 'see the log'}`;
  }
  const rows = result.rows.length;
  const skipped = result.rows.filter(row => row.status !== 'ok').length;
  const signatures = `${rows} op signature${rows === 1 ? '' : 's'}`;
  const line = `Replayed ${rows - skipped} of ${signatures} (${result.variants.join(', ')})`;
  return skipped > 0
    ? `${line}; ${skipped} could not be rebuilt: the table's reason column says why.`
    : `${line}.`;
}

/** The tab's form with its job: `onStart` when a new job is asked for, `onShow` once one succeeded. */
export function ReplaySection(props: {
  run: string;
  onStart: () => void;
  onShow: (job: IJob) => void;
}): JSX.Element {
  const { run } = props;
  const [form, setForm] = React.useState<IReplayForm>(DEFAULT_REPLAY_FORM);
  const { job, running, error, submitting, cancelling, dismiss, submit: follow, cancel } = useFollowedJob({
    what: 'the replay',
    isMine: j => isReplayJob(j) && j.request.replay.run === run,
    onResume: live => {
      if (isReplayJob(live)) {
        setForm(replayFormFromRequest(live.request.replay));
      }
    },
    onFinished: ended => {
      if (ended.status === 'succeeded') {
        props.onShow(ended);
      }
    }
  });
  const toggle = (variant: ReplayVariant, on: boolean) =>
    setForm(current => ({
      ...current,
      variants: on ? [...current.variants, variant] : current.variants.filter(v => v !== variant)
    }));

  const submit = (event: React.FormEvent) => {
    event.preventDefault();
    void follow(
      () => replayRequest(run, form),
      request => {
        props.onStart();
        return startReplay(request);
      }
    );
  };

  return (
    <section className="jp-Workbench-replayForm" aria-label="Op replay">
      <p className="jp-Workbench-replayAbout">
        Rebuilds the run's heaviest ops (by self time in its measured steps) from the shapes, dtypes and strides its
        trace recorded, and times each alone, beside the trace's time and its roofline position.
      </p>
      <form onSubmit={submit} noValidate>
        <div className="jp-Workbench-replayRow">
          <FormField prefix="replay" label="Top ops" name="top" form={form} type="number"
            bounds={{ minimum: 1, maximum: MAX_TOP }}
            onChange={(_, value) => setForm(current => ({ ...current, top: value }))}
            title={`The op signatures replayed: those with the most self time (1 to ${MAX_TOP})`} />
          <fieldset className="jp-Workbench-replayVariants">
            <legend>Variants</legend>
            {REPLAY_VARIANTS.map(variant => (
              <CheckField key={variant} id={`jp-Workbench-replay-${variant}`} label={variant}
                checked={form.variants.includes(variant)} onChange={on => toggle(variant, on)}
                title={VARIANT_TITLES[variant]} />
            ))}
          </fieldset>
          <JobButtons label="Replay" running={running} submitting={submitting} cancelling={cancelling}
            onCancel={cancel} />
        </div>
      </form>
      <ErrorNote text={error} />
      {job && running ? (
        <RunningJob job={job} what="replay" label={isReplayJob(job) ? replayLabel(job.request.replay) : 'replay'} />
      ) : null}
      {job && !running ? (
        <div
          className={`jp-Workbench-outcome jp-Workbench-replayOutcome jp-mod-${job.status}`}
          role={job.status === 'failed' ? 'alert' : 'status'}
        >
          <span className="jp-Workbench-outcomeText">{replayOutcome(job)}</span>
          <button className="jp-Workbench-linkButton" onClick={dismiss} title="Dismiss" aria-label="Dismiss">
            ✕
          </button>
          {job.status === 'failed' ? <JobLog log={job.log} /> : null}
        </div>
      ) : null}
    </section>
  );
}

/** The content of a run's replay tab: the form and its job, then the view of the job that last succeeded. */
export class ReplayPanel extends Panel {
  constructor(
    readonly run: string,
    private readonly _baseUrl: string
  ) {
    super();
    this.addClass('jp-Workbench-replay');
    const form = ReactWidget.create(
      <ReplaySection run={run} onStart={() => this._clear()} onShow={job => this._show(job)} />
    );
    form.addClass('jp-Workbench-replayHead');
    this.addWidget(form);
  }

  /** Draw the view again at the tab's width (nothing before a replay succeeded). */
  refresh(): void {
    void this._view?.refresh();
  }

  /** A new replay was asked for: the last one's view goes, so that no figures show beside the wrong request. */
  private _clear(): void {
    this._view?.dispose();
    this._view = null;
  }

  private _show(job: IJob): void {
    this._clear();
    this._view = new BokehView(replaySource(job.id), this._baseUrl);
    this.addWidget(this._view);
  }

  private _view: BokehView | null = null;
}
