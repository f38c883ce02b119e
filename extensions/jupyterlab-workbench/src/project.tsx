/**
 * Accelerator co-design in the panel (`workbench project`): a model (one forward of its example inputs), a run (its
 * measured steps' ops with recorded shapes) or a set of models projected onto an accelerator, a device of the
 * hardware table or a description file of the traces folder (docs/accelerators.md), with sweeps of its knobs.
 *
 * The sidebar's form becomes a `POST project` body; the server checks every field as the CLI reads it. Once the job
 * is queued a main-area tab follows it (`workbench project` reports no progress of its own: what it runs, for how
 * long, its log), then draws the report from the job's result (`GET project/<job>/view`: the operators as bars
 * coloured by what bounds each, the time per operator kind, the sweep curves and the guidance). A run's dashboard
 * fills the form with its run (`ProjectSection`'s `preset`).
 */

import { ReactWidget } from '@jupyterlab/ui-components';
import { Panel } from '@lumino/widgets';
import * as React from 'react';

import {
  fetchProjectOptions,
  IJob,
  IProjectOptions,
  IProjectRequest,
  IProjectResult,
  IRunRow,
  isFinished,
  isProjectJob,
  startProject
} from './api';
import { CheckField, ErrorNote, FormError, FormField, JobButtons, JobLog, RunningJob } from './form';
import { errorMessage, useFollowedJob, useWatchedJob } from './job';
import { runLabel } from './runs';
import { BokehView, projectSource } from './view';

/** The server's bounds (`project_handlers.py`), checked here first so a mistake shows at once. */
export const MAX_SWEEPS = 8;
export const MAX_BATCH = 256;
export const MAX_SEQ = 4096;
/** The accelerator select's value for "a description file" (no device is called that). */
export const FILE_CHOICE = '';
/** The device chosen first when the hardware table has it. */
export const DEFAULT_DEVICE = 'h100-sxm';

export type ProjectSourceKind = 'model' | 'run' | 'models';

/** One sweep of the form: a knob and its values, as typed. */
export interface ISweepRow {
  knob: string;
  values: string;
}

/** The form's fields, as typed. */
export interface IProjectForm {
  source: ProjectSourceKind;
  model: string;
  run: string;
  models: string[];
  /** A device of the hardware table, or `FILE_CHOICE`. */
  device: string;
  /** A description file, relative to the traces folder. */
  file: string;
  sweeps: ISweepRow[];
  /** '' projects the graph as recorded. */
  dtype: string;
  batch: string;
  seq: string;
}

export const DEFAULT_PROJECT_FORM: IProjectForm = {
  source: 'model',
  model: 'tiny-gpt',
  run: '',
  models: ['tiny-gpt'],
  device: DEFAULT_DEVICE,
  file: '',
  sweeps: [{ knob: 'bandwidth', values: '0.5,1,2,4' }],
  dtype: '',
  batch: '',
  seq: ''
};

/** The knobs a sweep row offers: the server's, `rate.<dtype>` spelled out for each dtype. */
export function sweepKnobs(options: IProjectOptions): string[] {
  return options.knobs.flatMap(knob => (knob === 'rate.<dtype>' ? options.dtypes.map(d => `rate.${d}`) : [knob]));
}

/** A whole number typed into `name`'s field, within 1..`most`; undefined when left blank. */
function whole(name: string, text: string, most: number): number | undefined {
  const typed = text.trim();
  if (typed === '') {
    return undefined;
  }
  const value = Number(typed);
  if (!/^[0-9]+$/.test(typed) || value < 1 || value > most) {
    throw new FormError(`${name}: a whole number from 1 to ${most.toLocaleString('en-US')}, got "${text}"`);
  }
  return value;
}

/** The `POST project` body the form describes; a `FormError` names the first field that is wrong. */
export function projectRequest(form: IProjectForm): IProjectRequest {
  const file = form.file.trim();
  if (form.device === FILE_CHOICE && file === '') {
    throw new FormError('description file: required (a YAML file in the traces folder, e.g. accelerators/npu.yaml)');
  }
  if (form.device === FILE_CHOICE && (file.startsWith('/') || file.startsWith('~'))) {
    throw new FormError(`description file: give it relative to the traces folder, got "${file}"`);
  }
  const request: IProjectRequest = { accelerator: form.device === FILE_CHOICE ? file : form.device };
  if (form.source === 'model') {
    const model = form.model.trim();
    if (model === '') {
      throw new FormError('model: required (a built-in such as tiny-gpt)');
    }
    request.model = model;
  } else if (form.source === 'run') {
    if (form.run === '') {
      throw new FormError('run: choose a run (there is none in the traces folder yet?)');
    }
    request.run = form.run;
  } else {
    if (form.models.length === 0) {
      throw new FormError('models: choose at least one');
    }
    request.models = [...form.models];
  }
  const sweeps = form.sweeps
    .map(row => ({ knob: row.knob, values: row.values.replace(/\s+/g, '') }))
    .filter(row => row.values !== '');
  if (sweeps.length > MAX_SWEEPS) {
    throw new FormError(`sweeps: at most ${MAX_SWEEPS}, got ${sweeps.length}`);
  }
  const knobs = sweeps.map(row => row.knob);
  const repeated = knobs.find((knob, index) => knobs.indexOf(knob) !== index);
  if (repeated) {
    throw new FormError(`sweeps: ${repeated} is swept more than once`);
  }
  if (sweeps.length > 0) {
    request.sweeps = sweeps.map(row => `${row.knob}=${row.values}`);
  } else if (form.source === 'models') {
    throw new FormError('sweeps: a model set compares sweeps; give at least one (e.g. bandwidth 0.5,1,2,4)');
  }
  if (form.dtype !== '') {
    request.dtype = form.dtype;
  }
  if (form.source !== 'run') {
    const batch = whole('batch', form.batch, MAX_BATCH);
    if (batch !== undefined) {
      request.batch = batch;
    }
  }
  if (form.source === 'model') {
    const seq = whole('sequence', form.seq, MAX_SEQ);
    if (seq !== undefined) {
      request.seq = seq;
    }
  }
  return request;
}

/** The form that describes `request` (a job's, e.g. one still running when the page was loaded). */
export function projectFormFromRequest(request: IProjectRequest, devices: string[]): IProjectForm {
  const device = devices.includes(request.accelerator) ? request.accelerator : FILE_CHOICE;
  return {
    ...DEFAULT_PROJECT_FORM,
    source: request.run !== undefined ? 'run' : request.models !== undefined ? 'models' : 'model',
    model: request.model ?? DEFAULT_PROJECT_FORM.model,
    run: request.run ?? '',
    models: request.models ?? DEFAULT_PROJECT_FORM.models,
    device,
    file: device === FILE_CHOICE ? request.accelerator : '',
    sweeps: (request.sweeps ?? []).map(text => {
      const [knob, ...values] = text.split('=');
      return { knob, values: values.join('=') };
    }),
    dtype: request.dtype ?? '',
    batch: request.batch !== undefined ? String(request.batch) : '',
    seq: request.seq !== undefined ? String(request.seq) : ''
  };
}

/**
 * What a projection projects, in a few words: `tiny-gpt on h100-sxm`, `run X on npu.yaml`, `3 models on b200`; a run
 * by `runName` (its id without).
 */
export function projectLabel(request: IProjectRequest, runName: (run: string) => string = run => `run ${run}`): string {
  const what = request.model ?? (request.run !== undefined ? runName(request.run)
    : `${request.models?.length ?? 0} model${request.models?.length === 1 ? '' : 's'}`);
  const sweeps = request.sweeps?.length ? `, sweeping ${request.sweeps.map(s => s.split('=')[0]).join(', ')}` : '';
  return `${what} on ${request.accelerator}${request.dtype ? ` at ${request.dtype}` : ''}${sweeps}`;
}

/** One line of a finished projection job: what it projected, or why it did not. */
export function projectOutcome(job: IJob): string {
  if (job.status === 'cancelled') {
    return 'Projection cancelled.';
  }
  const result = job.result as IProjectResult | null;
  if (job.status !== 'succeeded' || !result) {
    return `Projection failed: ${job.error ?? 'see the log'}`;
  }
  if (result.ops) {
    const findings = result.guidance?.length ?? 0;
    const steps = result.steps && result.steps > 1 ? ` over ${result.steps} steps` : '';
    return `Projected ${result.title} onto ${result.accelerator}: ${result.ops.length} operators${steps}, ` +
      `${findings} guidance finding${findings === 1 ? '' : 's'}.`;
  }
  return `Projected ${result.title}: ${result.models?.length ?? 0} models swept.`;
}

/** The title of a projection job's tab (a run by `runName`). */
export function projectTitle(job: IJob, runName?: (run: string) => string): string {
  if (!isProjectJob(job)) {
    return `Projection: ${job.id}`;
  }
  return `Projection: ${projectLabel({ ...job.request.project, sweeps: undefined }, runName)}`;
}

/** A labelled select bound to a form value. */
function SelectField(props: {
  id: string;
  label: string;
  value: string;
  onChange: (value: string) => void;
  options: { value: string; label: string; title?: string }[];
  title?: string;
}): JSX.Element {
  return (
    <div className="jp-Workbench-field">
      <label htmlFor={props.id}>{props.label}</label>
      <select id={props.id} className="jp-mod-styled" value={props.value} title={props.title}
        onChange={event => props.onChange(event.target.value)}>
        {props.options.map(option => (
          <option key={option.value} value={option.value} title={option.title}>
            {option.label}
          </option>
        ))}
      </select>
    </div>
  );
}

/** The sweep rows: a knob and its values each, removable, and a button to add one. */
function SweepRows(props: {
  rows: ISweepRow[];
  knobs: string[];
  onChange: (rows: ISweepRow[]) => void;
}): JSX.Element {
  const { rows, knobs } = props;
  const set = (index: number, row: Partial<ISweepRow>) =>
    props.onChange(rows.map((current, i) => (i === index ? { ...current, ...row } : current)));
  const unused = knobs.find(knob => !rows.some(row => row.knob === knob)) ?? knobs[0] ?? 'bandwidth';
  return (
    <fieldset className="jp-Workbench-sweeps">
      <legend>Sweeps</legend>
      {rows.map((row, index) => (
        <div className="jp-Workbench-sweepRow" key={index}>
          <select id={`jp-Workbench-project-knob-${index}`} className="jp-mod-styled" value={row.knob}
            aria-label={`sweep ${index + 1}: knob`} onChange={event => set(index, { knob: event.target.value })}
            title="The figure of the accelerator changed: a factor on bandwidth, on_chip (sizes), rate, rate.<dtype> or link, or the array shape">
            {(knobs.includes(row.knob) ? knobs : [row.knob, ...knobs]).map(knob => (
              <option key={knob} value={knob}>{knob}</option>
            ))}
          </select>
          <input id={`jp-Workbench-project-values-${index}`} className="jp-mod-styled" value={row.values}
            aria-label={`sweep ${index + 1}: values`} spellCheck={false}
            placeholder={row.knob === 'array' ? '64x64,128x128,256x256' : row.knob === 'chips' ? '1,2,4,8' : '0.5,1,2,4'}
            title={row.knob === 'array' ? 'Array shapes ROWSxCOLS, comma-separated'
              : row.knob === 'chips' ? 'Chip counts, comma-separated (the description needs chip_links)'
                : 'Factors, comma-separated'}
            onChange={event => set(index, { values: event.target.value })} />
          <button type="button" className="jp-Workbench-linkButton" title="Remove this sweep"
            aria-label={`remove sweep ${index + 1}`} onClick={() => props.onChange(rows.filter((_, i) => i !== index))}>
            ✕
          </button>
        </div>
      ))}
      {rows.length < MAX_SWEEPS ? (
        <button type="button" className="jp-Workbench-linkButton jp-Workbench-addSweep"
          onClick={() => props.onChange([...rows, { knob: unused, values: '' }])}>
          + add a sweep
        </button>
      ) : null}
    </fieldset>
  );
}

/** A finished projection job in the sidebar: its outcome, a button to show its report again, and its log. */
function Outcome(props: { job: IJob; onShow: (job: IJob) => void; onDismiss: () => void }): JSX.Element {
  const { job } = props;
  return (
    <div className={`jp-Workbench-outcome jp-Workbench-projectOutcome jp-mod-${job.status}`}
      role={job.status === 'failed' ? 'alert' : 'status'}>
      <span className="jp-Workbench-outcomeText">{projectOutcome(job)}</span>
      <button className="jp-Workbench-linkButton" onClick={props.onDismiss} title="Dismiss" aria-label="Dismiss">
        ✕
      </button>
      {job.status === 'succeeded' ? (
        <div className="jp-Workbench-buttons">
          <button className="jp-Button jp-mod-styled" onClick={() => props.onShow(job)}>
            Show the report
          </button>
        </div>
      ) : null}
      {job.status === 'failed' ? <JobLog log={job.log} /> : null}
    </div>
  );
}

/** A run to project, asked for from outside the form (a dashboard's toolbar); `n` tells two asks apart. */
export interface IProjectPreset {
  run: string;
  n: number;
}

/**
 * The co-design form with its job. `runs` are the runs listed (the run choice), `selected` those selected in the
 * list (one becomes the run chosen); `onShow` opens a job's tab, as soon as it is queued and again from its outcome.
 */
export function ProjectSection(props: {
  runs: IRunRow[];
  selected: string[];
  preset: IProjectPreset | null;
  onShow: (job: IJob) => void;
}): JSX.Element {
  const [form, setForm] = React.useState<IProjectForm>(DEFAULT_PROJECT_FORM);
  const [options, setOptions] = React.useState<IProjectOptions | null>(null);
  const [optionsError, setOptionsError] = React.useState<string | null>(null);
  const devices = React.useRef<string[]>([]);
  const { job, running, error, submitting, cancelling, dismiss, submit: follow, cancel } = useFollowedJob({
    what: 'the projection',
    isMine: isProjectJob,
    onResume: live => {
      if (isProjectJob(live)) {
        setForm(projectFormFromRequest(live.request.project, devices.current));
      }
    },
    onFinished: () => undefined // the job's tab draws the report
  });

  React.useEffect(() => {
    fetchProjectOptions()
      .then(fetched => {
        devices.current = fetched.devices;
        setOptions(fetched);
        setForm(current => {
          if (current.device === FILE_CHOICE && fetched.devices.includes(current.file.trim())) {
            return { ...current, device: current.file.trim(), file: '' }; // a resumed job's device
          }
          return fetched.devices.includes(current.device) || current.device === FILE_CHOICE
            ? current : { ...current, device: fetched.devices[0] ?? FILE_CHOICE };
        });
      })
      .catch(err => setOptionsError(`cannot read the projection options: ${errorMessage(err)}`));
  }, []);

  // one run selected in the list: the run to project
  const only = props.selected.length === 1 ? props.selected[0] : null;
  React.useEffect(() => {
    if (only !== null) {
      setForm(current => ({ ...current, run: only }));
    }
  }, [only]);
  React.useEffect(() => {
    if (props.preset) {
      const run = props.preset.run;
      setForm(current => ({ ...current, source: 'run', run }));
    }
  }, [props.preset]);
  const runs = props.runs.some(row => row.run === form.run) || form.run === ''
    ? props.runs : [{ run: form.run } as IRunRow, ...props.runs];
  const change = (name: keyof IProjectForm, value: unknown) => setForm(current => ({ ...current, [name]: value }));

  const submit = (event: React.FormEvent) => {
    event.preventDefault();
    void follow(
      () => projectRequest({ ...form, run: form.run || runs[0]?.run || '' }),
      async request => {
        const started = await startProject(request);
        props.onShow(started);
        return started;
      }
    );
  };

  const devicesShown = options?.devices ?? [form.device].filter(device => device !== FILE_CHOICE);
  const knobs = options ? sweepKnobs(options) : ['bandwidth', 'on_chip', 'rate', 'link', 'array'];
  return (
    <section className="jp-Workbench-project" aria-label="Co-design">
      <p className="jp-Workbench-projectAbout">
        Projects a model's operators onto an accelerator: per operator its unit, compute and memory time and what
        bounds it; what fits the chip badly; and how the step moves when one figure of the chip changes.
      </p>
      <form onSubmit={submit} noValidate>
        <div className="jp-Workbench-fieldRow">
          <SelectField id="jp-Workbench-project-source" label="Project" value={form.source}
            onChange={value => change('source', value as ProjectSourceKind)}
            title="One forward of a model, a captured run's measured steps (from its recorded shapes), or a set of models swept together"
            options={[{ value: 'model', label: 'a model' }, { value: 'run', label: 'a run' },
              { value: 'models', label: 'a model set' }]} />
          {form.source === 'model' ? (
            <FormField prefix="project" label="Model" name="model" form={form} onChange={change} required
              title="A built-in model (tiny-gpt, mlp, convnet), or one the server allows" />
          ) : null}
          {form.source === 'run' ? (
            <SelectField id="jp-Workbench-project-run" label="Run" value={form.run || runs[0]?.run || ''}
              onChange={value => change('run', value)} title="A run of the traces folder, captured with shapes"
              options={runs.map(row => ({ value: row.run, label: runLabel(row, row.run), title: row.run }))} />
          ) : null}
        </div>
        {form.source === 'models' ? (
          <fieldset className="jp-Workbench-projectModels">
            <legend>Models</legend>
            {(options?.model_set ?? form.models).map(name => (
              <CheckField key={name} id={`jp-Workbench-project-set-${name}`} label={name}
                checked={form.models.includes(name)}
                onChange={on => change('models', on ? [...form.models, name] : form.models.filter(m => m !== name))}
                title="Reduced configs built in code: nothing is downloaded" />
            ))}
          </fieldset>
        ) : null}
        <div className="jp-Workbench-fieldRow">
          <SelectField id="jp-Workbench-project-device" label="Accelerator" value={form.device}
            onChange={value => change('device', value)}
            title="A device of the hardware table, or a description file of your chip (docs/accelerators.md)"
            options={[...devicesShown.map(device => ({ value: device, label: device })),
              { value: FILE_CHOICE, label: 'a description file…' }]} />
          <SelectField id="jp-Workbench-project-dtype" label="Precision" value={form.dtype}
            onChange={value => change('dtype', value)}
            title="Project the graph at this precision (its floating-point operators' bytes and dtype)"
            options={[{ value: '', label: 'as recorded' },
              ...(options?.dtypes ?? []).map(dtype => ({ value: dtype, label: dtype }))]} />
        </div>
        {form.device === FILE_CHOICE ? (
          <FormField prefix="project" label="Description file (in the traces folder)" name="file" form={form}
            onChange={change} placeholder="accelerators/my-npu.yaml" required
            title="A YAML description of the accelerator, given relative to the traces folder" />
        ) : null}
        {form.source !== 'run' ? (
          <div className="jp-Workbench-fieldRow">
            <FormField prefix="project" label="Batch" name="batch" form={form} onChange={change} type="number"
              bounds={{ minimum: 1, maximum: MAX_BATCH }} placeholder="1" title="The model's batch size" />
            {form.source === 'model' ? (
              <FormField prefix="project" label="Sequence" name="seq" form={form} onChange={change} type="number"
                bounds={{ minimum: 1, maximum: MAX_SEQ }} placeholder="its default"
                title="A sequence model's length" />
            ) : null}
          </div>
        ) : null}
        <SweepRows rows={form.sweeps} knobs={knobs} onChange={rows => change('sweeps', rows)} />
        <JobButtons label="Project" running={running} submitting={submitting} cancelling={cancelling}
          onCancel={cancel} />
      </form>
      <ErrorNote text={optionsError} />
      <ErrorNote text={error} />
      {job && running ? (
        <RunningJob job={job} what="projection"
          label={isProjectJob(job) ? projectLabel(job.request.project) : 'projection'} />
      ) : null}
      {job && !running ? <Outcome job={job} onShow={props.onShow} onDismiss={dismiss} /> : null}
    </section>
  );
}

/** A projection job in its tab: its progress while it runs, then its outcome (and its log when it failed). */
function ProjectJobStatus(props: { started: IJob; onSucceeded: (job: IJob) => void }): JSX.Element {
  const { job, error } = useWatchedJob(props.started);
  const reported = React.useRef(false);
  React.useEffect(() => {
    if (job.status === 'succeeded' && !reported.current) {
      reported.current = true;
      props.onSucceeded(job);
    }
  }, [job]);
  return (
    <>
      <ErrorNote text={error} />
      {!isFinished(job) ? (
        <RunningJob job={job} what="projection"
          label={isProjectJob(job) ? projectLabel(job.request.project) : 'projection'} />
      ) : (
        <div className={`jp-Workbench-outcome jp-Workbench-projectOutcome jp-mod-${job.status}`}
          role={job.status === 'failed' ? 'alert' : 'status'}>
          <span className="jp-Workbench-outcomeText">{projectOutcome(job)}</span>
          {job.status === 'failed' ? <JobLog log={job.log} /> : null}
        </div>
      )}
    </>
  );
}

/** The content of a projection job's tab: the job's status, then its report once it succeeded. */
export class ProjectPanel extends Panel {
  constructor(
    readonly job: IJob,
    private readonly _baseUrl: string
  ) {
    super();
    this.addClass('jp-Workbench-projectTab');
    const head = ReactWidget.create(<ProjectJobStatus started={job} onSucceeded={ended => this._show(ended)} />);
    head.addClass('jp-Workbench-projectHead');
    this.addWidget(head);
  }

  /** Draw the report again at the tab's width (nothing before the job succeeded). */
  refresh(): void {
    void this._view?.refresh();
  }

  private _show(job: IJob): void {
    if (this._view === null) {
      this._view = new BokehView(projectSource(job.id), this._baseUrl);
      this.addWidget(this._view);
    }
  }

  private _view: BokehView | null = null;
}
