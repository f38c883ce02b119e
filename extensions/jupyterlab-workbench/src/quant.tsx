/**
 * The quantization form of the Workbench sidebar: the quantization lab on a model (`workbench quant`: which layers
 * and tensors take which low-bit format, and what each recipe costs in accuracy, memory and time), and the live
 * status of its job.
 *
 * The form becomes a `POST quant` body; the server checks every format and recipe as the CLI reads them. The job is
 * followed (`job.ts`) until it ends; `workbench quant` reports no progress of its own, so the job shows what it
 * runs, for how long, and its log. Once it succeeded, its views open in a main-area tab (the layers × formats heat
 * map, the recipes' table and Pareto, the outliers, the error histograms; `GET quant/<job>/view`), which the
 * outcome's button opens again.
 */

import * as React from 'react';

import { IJob, IQuantRequest, IQuantResult, isQuantJob, startQuant } from './api';
import { CheckField, ErrorNote, FormError, FormField, JobButtons, JobLog, RunningJob } from './form';
import { useFollowedJob } from './job';

/** The server's bounds (`quant_handlers.py`), checked here first so a mistake shows at once. */
export const MAX_FORMATS = 16;
export const MAX_RECIPES = 16;

/** The form's fields, as typed (text), before they are checked; '' leaves the lab's default. */
export interface IQuantForm {
  model: string;
  /** '' for the model's default: trained where a built-in has trained weights. */
  weights: '' | 'trained' | 'random';
  /** Formats, comma-separated. */
  formats: string;
  /** Recipes, one per line. */
  recipes: string;
  budget: string;
  device: string;
  measure: boolean;
}

export const DEFAULT_QUANT_FORM: IQuantForm = {
  model: 'tiny-gpt',
  weights: '',
  formats: '',
  recipes: '',
  budget: '',
  device: 'b200',
  measure: true
};

/** The items of a list typed with `separator` between them, blanks dropped, at most `most`, none twice. */
function items(name: string, text: string, separator: RegExp, most: number): string[] {
  const values = text.split(separator).map(item => item.trim()).filter(item => item !== '');
  if (values.length > most) {
    throw new FormError(`${name}: at most ${most}, got ${values.length}`);
  }
  const repeated = values.filter((value, index) => values.indexOf(value) !== index);
  if (repeated.length > 0) {
    throw new FormError(`${name}: ${[...new Set(repeated)].join(', ')} named more than once`);
  }
  return values;
}

/** The `POST quant` body the form describes; a `FormError` names the first field that is wrong. */
export function quantRequest(form: IQuantForm): IQuantRequest {
  const model = form.model.trim();
  if (model === '') {
    throw new FormError('model: required (a built-in such as tiny-gpt)');
  }
  const request: IQuantRequest = { model, measure: form.measure };
  if (form.weights !== '') {
    request.weights = form.weights;
  }
  const formats = items('formats', form.formats, /,/, MAX_FORMATS);
  if (formats.length > 0) {
    request.formats = formats;
  }
  const recipes = items('recipes', form.recipes, /\n/, MAX_RECIPES);
  if (recipes.length > 0) {
    request.recipes = recipes;
  }
  const budget = form.budget.trim();
  if (budget !== '') {
    request.budget = budget;
  }
  const device = form.device.trim();
  if (device !== '') {
    request.device = device;
  }
  return request;
}

/** The form that describes `request` (a job's, e.g. one still running when the page was loaded). */
export function quantFormFromRequest(request: IQuantRequest): IQuantForm {
  return {
    model: request.model,
    weights: request.weights ?? '',
    formats: (request.formats ?? []).join(','),
    recipes: (request.recipes ?? []).join('\n'),
    budget: request.budget ?? '',
    device: request.device ?? '',
    measure: request.measure ?? true
  };
}

/** What a quantization job does, in a few words: `mlp: 2 formats, the lab's recipes`. */
export function quantLabel(request: IQuantRequest): string {
  const formats = request.formats ? `${request.formats.length} format${request.formats.length === 1 ? '' : 's'}`
    : "the lab's formats";
  const recipes = request.recipes?.length
    ? `${request.recipes.length} recipe${request.recipes.length === 1 ? '' : 's'}` : "the lab's recipes";
  return `${request.model}: ${formats}, ${recipes}`;
}

/** One line of a finished quantization job: what the lab compared, or why it did not. */
export function quantOutcome(job: IJob): string {
  if (job.status === 'cancelled') {
    return 'Quantization lab cancelled.';
  }
  const result = job.result as IQuantResult | null;
  if (job.status !== 'succeeded' || !result) {
    return `Quantization lab failed: ${job.error ?? 'see the log'}`;
  }
  const recipes = result.recipes.length - 1; // the fp32 reference comes first
  const layers = new Set((result.layers ?? []).map(row => row.layer)).size;
  const formats = new Set((result.layers ?? []).map(row => row.format)).size;
  const scan = layers > 0 ? `, ${layers} layers × ${formats} formats` : '';
  return `Quantization lab on ${result.model}: ${recipes} recipe${recipes === 1 ? '' : 's'}${scan}`;
}

/** The title of a quantization job's view. */
export function quantTitle(job: IJob): string {
  const result = job.result as IQuantResult | null;
  return `Quantization: ${result?.model ?? (isQuantJob(job) ? job.request.quant.model : job.id)}`;
}

/** A finished quantization job: its outcome, a button to show its views (once it succeeded), and its log. */
function Outcome(props: { job: IJob; onShow: (job: IJob) => void; onDismiss: () => void }): JSX.Element {
  const { job } = props;
  return (
    <div
      className={`jp-Workbench-outcome jp-Workbench-quantOutcome jp-mod-${job.status}`}
      role={job.status === 'failed' ? 'alert' : 'status'}
    >
      <span className="jp-Workbench-outcomeText">{quantOutcome(job)}</span>
      <button className="jp-Workbench-linkButton" onClick={props.onDismiss} title="Dismiss" aria-label="Dismiss">
        ✕
      </button>
      {job.status === 'succeeded' ? (
        <div className="jp-Workbench-buttons">
          <button className="jp-Button jp-mod-styled" onClick={() => props.onShow(job)}>
            Show the views
          </button>
        </div>
      ) : null}
      {job.status === 'failed' ? <JobLog log={job.log} /> : null}
    </div>
  );
}

/**
 * The quantization form with its job. `onShow` opens a succeeded job's views: once when a job it follows succeeds,
 * and again from its outcome.
 */
export function QuantSection(props: { onShow: (job: IJob) => void }): JSX.Element {
  const [form, setForm] = React.useState<IQuantForm>(DEFAULT_QUANT_FORM);
  const { job, running, error, submitting, cancelling, dismiss, submit: follow, cancel } = useFollowedJob({
    what: 'the quantization lab',
    isMine: isQuantJob,
    onResume: live => {
      if (isQuantJob(live)) {
        setForm(quantFormFromRequest(live.request.quant));
      }
    },
    onFinished: ended => {
      if (ended.status === 'succeeded') {
        props.onShow(ended);
      }
    }
  });
  const change = (name: keyof IQuantForm, value: string | boolean) =>
    setForm(current => ({ ...current, [name]: value }));

  const submit = (event: React.FormEvent) => {
    event.preventDefault();
    void follow(() => quantRequest(form), startQuant);
  };

  return (
    <section className="jp-Workbench-quant" aria-label="Quantization">
      <form onSubmit={submit} noValidate>
        <div className="jp-Workbench-fieldRow">
          <FormField prefix="quant" label="Model" name="model" form={form} onChange={change} required
            title="A built-in model (tiny-gpt, convnet, mlp), or one the server allows" />
          <div className="jp-Workbench-field">
            <label htmlFor="jp-Workbench-quant-weights">Weights</label>
            <select
              id="jp-Workbench-quant-weights"
              name="weights"
              className="jp-mod-styled"
              value={form.weights}
              onChange={event => change('weights', event.target.value)}
              title="A built-in's weights: trained ones are judged on held-out data (tiny-gpt, convnet)"
            >
              <option value="">default</option>
              <option value="trained">trained</option>
              <option value="random">random</option>
            </select>
          </div>
        </div>
        <FormField prefix="quant" label="Formats" name="formats" form={form} onChange={change}
          placeholder="the lab's: FP8, MX, NVFP4, INT8, INT4"
          title="Formats of the sensitivity scan, comma-separated: FORMAT[/GRANULARITY][/sym|asym], e.g. fp8-e4m3/channel, mxfp4, nvfp4, int4/group32" />
        <FormField prefix="quant" label="Recipes" name="recipes" form={form} onChange={change} rows={3}
          placeholder={"the lab's; one per line, e.g.\nlinear.weight=nvfp4,kv=fp8-e4m3/head"}
          title="Recipes to compare, one per line: TARGET=FORMAT,... with TARGET PATTERN.weight, PATTERN.input, kv, k, v, q or p" />
        <div className="jp-Workbench-fieldRow">
          <FormField prefix="quant" label="Budget" name="budget" form={form} onChange={change} placeholder="none"
            title="Also plan mixed precision under this error budget: sqnr=DB and/or kl=NATS, e.g. sqnr=30" />
          <FormField prefix="quant" label="Device" name="device" form={form} onChange={change} placeholder="b200"
            title="The device of the hardware table the recipes' time is projected on (b200, h100, tpu-v5e, ...)" />
        </div>
        <CheckField id="jp-Workbench-quant-measure" label="Measure real CPU kernels (bf16, torchao int8)"
          checked={form.measure} onChange={checked => change('measure', checked)}
          title="Time the recipes that have a real kernel on the server's CPU beside fp32" />
        <JobButtons label="Run" running={running} submitting={submitting} cancelling={cancelling} onCancel={cancel} />
      </form>
      <ErrorNote text={error} />
      {job && running ? (
        <RunningJob job={job} what="quantization" label={isQuantJob(job) ? quantLabel(job.request.quant) : 'quantization'} />
      ) : null}
      {job && !running ? <Outcome job={job} onShow={props.onShow} onDismiss={dismiss} /> : null}
    </section>
  );
}
