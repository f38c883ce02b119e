/**
 * The capture form of the Workbench sidebar and the live status of its job.
 *
 * The form becomes a `POST jobs` body (the CLI's capture options: Batch and Sequence take a comma list, a sweep,
 * as `--batch 1,8,32` does, checked as they are typed); its choices (models, variants,
 * profilers, devices), bounds and placeholder defaults come from the server's `GET capture/options`,
 * which derives them from the capture settings, so the form offers what the server accepts. The job is
 * then followed (`job.ts`: polled every `POLL_MS`) until it ends, showing its current task and a progress
 * bar, with a cancel button. Bad input and the server's errors are shown under the form; a failed job shows its error and
 * the log tail.
 */

import * as React from 'react';

import {
  fetchCaptureOptions,
  ICaptureField,
  ICaptureOptions,
  ICaptureRequest,
  ICaptureResult,
  IJob,
  isImportJob,
  isQuantJob,
  isReplayJob,
  isServeJob,
  startCapture
} from './api';
import { CheckField, ErrorNote, FormError, FormField, JobButtons, JobLog } from './form';
import { errorMessage, useFollowedJob } from './job';

/** The profiler whose kernel selection (`kernel_name`, `launch_count`) the form shows. */
export const KERNEL_PROFILER = 'ncu';

/** The form's fields, as typed (text), before they are checked; '' leaves the server's default. */
export interface ICaptureForm {
  model: string;
  variants: string;
  batch: string;
  seq: string;
  iterations: string;
  warmup: string;
  threads: string;
  overrides: string;
  profile: boolean;
  device: string;
  profiler: string;
  kernel_name: string;
  launch_count: string;
}

export const DEFAULT_FORM: ICaptureForm = {
  model: 'tiny-gpt',
  variants: 'eager,bf16',
  batch: '4',
  seq: '',
  iterations: '30',
  warmup: '5',
  threads: '',
  overrides: '',
  profile: true,
  device: '',
  profiler: '',
  kernel_name: '',
  launch_count: ''
};

/** The options' fields by key. */
export function fieldsByKey(options: ICaptureOptions): Map<string, ICaptureField> {
  return new Map(options.fields.map(field => [field.key as string, field]));
}

/** The text of an option's default, for a placeholder ('' when it has none). */
export function defaultText(options: ICaptureOptions | null, key: keyof ICaptureRequest): string {
  const value = options?.fields.find(field => field.key === key)?.default;
  return value === null || value === undefined ? '' : String(value);
}

/** The profiler the form will use: the one chosen, else the server's default. */
export function chosenProfiler(form: ICaptureForm, options: ICaptureOptions | null): string {
  return form.profiler || defaultText(options, 'profiler');
}

/** The bounds of an integer option in words: "from 1 to 4096". */
function rangeText(field: ICaptureField | undefined): string {
  const minimum = field?.minimum ?? 0;
  const maximum = field?.maximum ?? null;
  return maximum === null ? `from ${minimum}` : `from ${minimum} to ${maximum}`;
}

/** `text` (trimmed) as a whole number within `field`'s bounds, or null when it is none. */
function wholeNumber(text: string, field: ICaptureField | undefined): number | null {
  const number = Number(text);
  const maximum = field?.maximum ?? null;
  return /^\d+$/.test(text) && number >= (field?.minimum ?? 0) && (maximum === null || number <= maximum)
    ? number
    : null;
}

function integer(
  name: string,
  text: string,
  field: ICaptureField | undefined,
  required: boolean
): number | undefined {
  const value = text.trim();
  if (value === '') {
    if (required) {
      throw new FormError(`${name}: required`);
    }
    return undefined;
  }
  const number = wholeNumber(value, field);
  if (number === null) {
    throw new FormError(`${name}: expected a whole number ${rangeText(field)}, got "${value}"`);
  }
  return number;
}

/**
 * A size (batch, sequence) as typed: one whole number, or several separated by commas (`1,8,32`), a sweep, as
 * the CLI's `--batch 1,8,32` takes them; each within `field`'s bounds, none twice. A `FormError` names the field.
 */
export function sizes(
  name: string,
  text: string,
  field: ICaptureField | undefined,
  required: boolean
): number | number[] | undefined {
  const value = text.trim();
  if (value === '') {
    if (required) {
      throw new FormError(`${name}: required`);
    }
    return undefined;
  }
  const numbers = value.split(',').map(item => wholeNumber(item.trim(), field));
  if (numbers.some(number => number === null)) {
    throw new FormError(
      `${name}: expected a whole number ${rangeText(field)}, or several separated by commas for a sweep ` +
        `(1,8,32), got "${value}"`
    );
  }
  const repeated = numbers.filter((number, i) => numbers.indexOf(number) !== i);
  if (repeated.length > 0) {
    throw new FormError(`${name}: ${[...new Set(repeated)].join(', ')} listed more than once`);
  }
  return numbers.length === 1 ? numbers[0]! : (numbers as number[]);
}

/** The message of the `FormError` that reading a field throws, or null when it reads. */
export function fieldError(read: () => unknown): string | null {
  try {
    read();
    return null;
  } catch (error) {
    if (error instanceof FormError) {
      return error.message;
    }
    throw error;
  }
}

/** How many shapes a form's sizes make: the product of the values of each (1 for one value each). */
export function shapeCount(...values: (number | number[] | undefined)[]): number {
  return values.reduce<number>((count, value) => count * (Array.isArray(value) ? value.length : 1), 1);
}

/**
 * Model config overrides typed as `KEY=VALUE` words (spaces or commas between them), each value read as
 * JSON when it is JSON (`layers=2` → 2, `act=gelu` → "gelu"), as the CLI's `--set` reads them.
 */
export function parseOverrides(text: string): { [key: string]: unknown } {
  const overrides: { [key: string]: unknown } = {};
  for (const word of text.split(/[\s,]+/).filter(w => w !== '')) {
    const at = word.indexOf('=');
    if (at <= 0) {
      throw new FormError(`overrides: "${word}" is not KEY=VALUE`);
    }
    const raw = word.slice(at + 1);
    let value: unknown = raw;
    try {
      value = JSON.parse(raw);
    } catch {
      value = raw;
    }
    overrides[word.slice(0, at)] = value;
  }
  return overrides;
}

/**
 * The `POST jobs` body the form describes, checked against the server's `options` (bounds, registered
 * variants and profilers); a `FormError` names the first field that is wrong.
 */
export function captureRequest(form: ICaptureForm, options: ICaptureOptions): ICaptureRequest {
  const fields = fieldsByKey(options);
  const model = form.model.trim();
  if (model === '') {
    throw new FormError(
      `model: required (a built-in model: ${options.builtin_models.join(', ')}; hf-config:<preset>, hf:<id or folder>, torchvision:<name>, timm:<name>, onnx:<file>, package.module:factory or a .pt2 file)`
    );
  }
  const known = fields.get('variants')?.choices ?? [];
  const variants = form.variants.split(/[\s,]+/).filter(v => v !== '');
  if (variants.length === 0) {
    throw new FormError(`variants: name at least one (${known.join(', ')})`);
  }
  const unknown = variants.filter(v => known.length > 0 && !known.includes(v));
  if (unknown.length > 0) {
    throw new FormError(`variants: unknown ${unknown.join(', ')} (valid: ${known.join(', ')})`);
  }
  const request: ICaptureRequest = {
    model,
    variants,
    batch: sizes('batch', form.batch, fields.get('batch'), true),
    seq: sizes('sequence', form.seq, fields.get('seq'), false),
    iterations: integer('iterations', form.iterations, fields.get('iterations'), true),
    warmup: integer('warmup', form.warmup, fields.get('warmup'), true),
    threads: integer('threads', form.threads, fields.get('threads'), false),
    profile: form.profile
  };
  const device = form.device.trim();
  if (device !== '') {
    request.device = device;
  }
  if (form.profiler !== '') {
    request.profiler = form.profiler;
  }
  if (chosenProfiler(form, options) === KERNEL_PROFILER) {
    const kernel = form.kernel_name.trim();
    if (kernel !== '') {
      request.kernel_name = kernel;
    }
    request.launch_count = integer('launch count', form.launch_count, fields.get('launch_count'), false);
  }
  const overrides = parseOverrides(form.overrides);
  if (Object.keys(overrides).length > 0) {
    request.overrides = overrides;
  }
  for (const key of Object.keys(request) as (keyof ICaptureRequest)[]) {
    if (request[key] === undefined) {
      delete request[key];
    }
  }
  return request;
}

/**
 * The form that describes `request` (a job's, e.g. one still running when the page was loaded): its values as
 * typed text, the form's defaults where it has none.
 */
export function formFromRequest(request: ICaptureRequest): ICaptureForm {
  const text = (value: unknown): string | undefined =>
    value === null || value === undefined ? undefined : Array.isArray(value) ? value.join(',') : String(value);
  const variants = Array.isArray(request.variants) ? request.variants.join(',') : text(request.variants);
  const overrides = Object.entries(request.overrides ?? {})
    .map(([key, value]) => `${key}=${typeof value === 'string' ? value : JSON.stringify(value)}`)
    .join(' ');
  const form: ICaptureForm = { ...DEFAULT_FORM, overrides, seq: '', threads: '', device: '', profiler: '',
    kernel_name: '', launch_count: '' };
  const values: Partial<Record<keyof ICaptureForm, string | undefined>> = {
    model: text(request.model), variants, batch: text(request.batch), seq: text(request.seq),
    iterations: text(request.iterations), warmup: text(request.warmup), threads: text(request.threads),
    device: text(request.device), profiler: text(request.profiler), kernel_name: text(request.kernel_name),
    launch_count: text(request.launch_count)
  };
  for (const [key, value] of Object.entries(values) as [keyof ICaptureForm, string | undefined][]) {
    if (value !== undefined) {
      (form as any)[key] = value;
    }
  }
  if (typeof request.profile === 'boolean') {
    form.profile = request.profile;
  }
  return form;
}

/**
 * The label of a job's progress: its current task, with the counts of the task it belongs to when it names
 * one item of a larger task (`prepare eager` of `prepare`: the variant being prepared, and how many are done).
 */
export function progressLabel(job: IJob): { task: string; completed: number | null; total: number | null } {
  const { task, completed, total, tasks } = job.progress;
  if (task === null) {
    return { task: 'starting', completed: null, total: null };
  }
  const parent = task.includes(' ') ? tasks[task.split(' ')[0]] : undefined;
  if (parent && !parent.done) {
    return { task, completed: parent.completed, total: parent.total };
  }
  return { task, completed, total };
}

/** A job's progress: its current task with a bar (indeterminate while the total is unknown). */
function Progress(props: { job: IJob }): JSX.Element {
  const { job } = props;
  if (job.status === 'queued') {
    return (
      <div className="jp-Workbench-progressLabel">
        Queued{job.queue_position ? ` (position ${job.queue_position})` : ''}
      </div>
    );
  }
  const { task, completed, total } = progressLabel(job);
  const known = total !== null && total > 0 && completed !== null;
  const percent = known ? Math.min(100, (100 * completed!) / total!) : 0;
  return (
    <div className="jp-Workbench-progressBox">
      <div className="jp-Workbench-progressLabel">
        <span className="jp-Workbench-task">{task}</span>
        {known ? <span>{` ${completed} / ${total}`}</span> : null}
      </div>
      <div
        className={
          'jp-Workbench-progress' + (known ? '' : ' jp-mod-indeterminate')
        }
        role="progressbar"
        aria-label={`capture progress: ${task}`}
        aria-valuemin={0}
        aria-valuemax={known ? total! : undefined}
        aria-valuenow={known ? completed! : undefined}
      >
        <div
          className="jp-Workbench-progressFill"
          style={{ width: known ? `${percent}%` : undefined }}
        />
      </div>
    </div>
  );
}

/** A finished job: what it captured, or why it did not. */
function Outcome(props: { job: IJob; onDismiss: () => void }): JSX.Element {
  const { job } = props;
  let text: string;
  if (job.status === 'succeeded') {
    const result = job.result as ICaptureResult | null;
    const runs = result?.runs ?? [];
    text = `Captured ${runs.length} run${runs.length === 1 ? '' : 's'}` +
      (result?.experiment ? ` (experiment ${result.experiment})` : '');
  } else if (job.status === 'cancelled') {
    text = 'Capture cancelled: nothing was kept.';
  } else {
    text = `Capture failed: ${job.error ?? 'see the log'}`;
  }
  return (
    <div
      className={`jp-Workbench-outcome jp-mod-${job.status}`}
      role={job.status === 'failed' ? 'alert' : 'status'}
    >
      <span className="jp-Workbench-outcomeText">{text}</span>
      <button
        className="jp-Workbench-linkButton"
        onClick={props.onDismiss}
        title="Dismiss"
      >
        ✕
      </button>
      {job.status === 'failed' ? <JobLog log={job.log} /> : null}
    </div>
  );
}

/**
 * The capture form with its job. `onFinished` runs once when a job it follows ends.
 */
export function CaptureSection(props: {
  onFinished: (job: IJob) => void;
}): JSX.Element {
  const [form, setForm] = React.useState<ICaptureForm>(DEFAULT_FORM);
  const [options, setOptions] = React.useState<ICaptureOptions | null>(null);
  const optionsRequest = React.useRef<Promise<ICaptureOptions> | null>(null);
  /** The server's capture options: fetched once, again after a failure. */
  const loadOptions = () => {
    if (optionsRequest.current === null) {
      optionsRequest.current = fetchCaptureOptions();
      optionsRequest.current.then(setOptions, () => {
        optionsRequest.current = null;
      });
    }
    return optionsRequest.current;
  };
  React.useEffect(() => {
    loadOptions().catch(() => {
      // submitting asks again, and shows why it failed
    });
  }, []);

  const { job, running, error, submitting, cancelling, dismiss, submit: follow, cancel } = useFollowedJob({
    what: 'the capture',
    isMine: j => !isImportJob(j) && !isServeJob(j) && !isQuantJob(j) && !isReplayJob(j),
    onResume: live => setForm(formFromRequest(live.request as ICaptureRequest)), // the settings it runs with
    onFinished: props.onFinished
  });

  const fields = options ? fieldsByKey(options) : new Map<string, ICaptureField>();
  const profiler = chosenProfiler(form, options);
  // the sizes are checked as they are typed (a comma list is a sweep), so a slip shows before Capture
  const batchError = fieldError(() => sizes('batch', form.batch, fields.get('batch'), true));
  const seqError = fieldError(() => sizes('sequence', form.seq, fields.get('seq'), false));
  const shapes = batchError || seqError ? 1 : shapeCount(
    sizes('batch', form.batch, fields.get('batch'), true), sizes('sequence', form.seq, fields.get('seq'), false));
  const variantCount = form.variants.split(/[\s,]+/).filter(v => v !== '').length;

  const change = (name: keyof ICaptureForm, value: string | boolean) =>
    setForm(current => ({ ...current, [name]: value }));

  const submit = (event: React.FormEvent) => {
    event.preventDefault();
    void follow(async () => {
      const known = options ?? (await loadOptions().catch(err => {
        throw new Error(`cannot read the server's capture options: ${errorMessage(err)}`);
      }));
      return captureRequest(form, known);
    }, startCapture);
  };

  return (
    <section className="jp-Workbench-capture" aria-label="Capture">
      <form onSubmit={submit} noValidate>
        <datalist id="jp-Workbench-models">
          {(options?.models ?? []).map(m => (
            <option key={m} value={m} />
          ))}
        </datalist>
        <datalist id="jp-Workbench-devices">
          {(options?.devices ?? []).map(d => (
            <option key={d} value={d} />
          ))}
        </datalist>
        <FormField prefix="capture" label="Model" name="model" form={form} onChange={change} list="jp-Workbench-models"
          title={`A built-in model (${(options?.builtin_models ?? []).join(', ')}), hf-config:<preset>, hf:<id or folder>, torchvision:<name>, timm:<name>, onnx:<file>, package.module:factory, or a .pt2 file`} />
        <FormField prefix="capture" label="Variants" name="variants" form={form} onChange={change}
          title={(options?.variants ?? []).map(v => `${v.name}: ${v.description}`).join('\n')} />
        <div className="jp-Workbench-fieldRow">
          <FormField prefix="capture" label="Batch" name="batch" form={form} onChange={change} bounds={fields.get('batch')}
            error={batchError} placeholder="4 or 1,8,32"
            title="Batch size, or several separated by commas (1,8,32): a sweep, every variant at every shape" />
          <FormField prefix="capture" label="Sequence" name="seq" form={form} onChange={change} bounds={fields.get('seq')}
            error={seqError} placeholder="default"
            title="Sequence length (tiny-gpt), or several separated by commas (128,512): a sweep" />
        </div>
        {shapes > 1 ? (
          <div className="jp-Workbench-sweepNote" role="status">
            Sweep: {shapes} shapes × {variantCount} variant{variantCount === 1 ? '' : 's'} ={' '}
            {shapes * variantCount} runs
          </div>
        ) : null}
        <div className="jp-Workbench-fieldRow">
          <FormField prefix="capture" label="Iterations" name="iterations" type="number" form={form} onChange={change}
            bounds={fields.get('iterations')} />
          <FormField prefix="capture" label="Warmup" name="warmup" type="number" form={form} onChange={change} bounds={fields.get('warmup')} />
          <FormField prefix="capture" label="Threads" name="threads" type="number" form={form} onChange={change}
            bounds={fields.get('threads')} placeholder="auto"
            title="torch threads; empty: 1 on machines with 4 cores or fewer, else torch's setting" />
        </div>
        <FormField prefix="capture" label="Overrides" name="overrides" form={form} onChange={change}
          placeholder="d_model=64 layers=2" title="Model config overrides, KEY=VALUE (the CLI's --set)" />
        <div className="jp-Workbench-fieldRow">
          <FormField prefix="capture" label="Device" name="device" form={form} onChange={change} list="jp-Workbench-devices"
            placeholder={defaultText(options, 'device')} title="cpu, cuda[:N] or tpu[:N] (the devices of the server are offered)" />
          <div className="jp-Workbench-field">
            <label htmlFor="jp-Workbench-capture-profiler">Profiler</label>
            <select
              id="jp-Workbench-capture-profiler"
              name="profiler"
              className="jp-mod-styled"
              value={profiler}
              onChange={event => change('profiler', event.target.value)}
            >
              {(options?.profilers ?? [{ name: profiler, description: '' }]).map(p => (
                <option key={p.name} value={p.name} title={p.description}>
                  {p.name}
                </option>
              ))}
            </select>
          </div>
        </div>
        {profiler === KERNEL_PROFILER ? (
          <div className="jp-Workbench-fieldRow">
            <FormField prefix="capture" label="Kernel name" name="kernel_name" form={form} onChange={change} placeholder="all kernels"
              title="Profile only these kernels: a name, or regex:<expression>" />
            <FormField prefix="capture" label="Launch count" name="launch_count" type="number" form={form} onChange={change}
              bounds={fields.get('launch_count')} placeholder={defaultText(options, 'launch_count')}
              title="Kernel launches to profile per variant" />
          </div>
        ) : null}
        <CheckField id="jp-Workbench-capture-profile" label="Profiler trace (torch.profiler / jax.profiler)"
          checked={form.profile} onChange={checked => change('profile', checked)} />
        <JobButtons label="Capture" running={running} submitting={submitting} cancelling={cancelling} onCancel={cancel} />
      </form>
      <ErrorNote text={error} />
      {job && running ? <Progress job={job} /> : null}
      {job && !running ? (
        <Outcome job={job} onDismiss={dismiss} />
      ) : null}
    </section>
  );
}
