/**
 * The workbench REST API of the Jupyter server extension (`workbench/server/handlers.py`), typed.
 *
 * Every call goes through `ServerConnection.makeRequest`, so it carries the server's authentication
 * (token header, XSRF cookie). A failure of any kind becomes a `WorkbenchApiError` whose message is the
 * server's own `{"message": ...}` when it sent one, ready to be shown in the panel.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ICaptureRequest } from './captureRequest.generated';

/** The API's path under the server's base URL. */
export const API_PATH = 'workbench/api';

/** An API call that failed; `status` is the HTTP status, 0 when the server could not be reached. */
export class WorkbenchApiError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
    this.name = 'WorkbenchApiError';
  }
}

/** One run as `GET runs` lists it (the rows of `workbench ls --json`). */
export interface IRunRow {
  run: string;
  model: string | null;
  variant: string | null;
  device: string | null;
  status: string | null;
  p50_ms: number | null;
  experiment: string | null;
  created: string;
  /** The batch it ran at (null for an import). */
  batch?: number | null;
  /** The sequence length it ran at (null for an import, or a model without a sequence axis). */
  seq?: number | null;
  /** Its display name: a sweep's label ("eager-b4-s128"), its variant, an import's file less its suffix. */
  name?: string | null;
  /** The name of the file an import came from. */
  file?: string | null;
  /** Why its latency samples are noisy (`workbench.analysis.noise`); null when they are not. */
  noise?: string | null;
}

/** One experiment as `GET runs` lists it. */
export interface IExperiment {
  experiment: string;
  model: string | null;
  reference: string | null;
  runs: string[];
  variants: string[] | null;
  failed: unknown;
  created: string | null;
}

/** The reply of `GET runs`: the runs and experiments of the traces root, and entries it could not read. */
export interface IListing {
  root: string;
  runs: IRunRow[];
  experiments: IExperiment[];
  problems: { entry: string; message: string }[];
}

export type JobStatus =
  | 'queued'
  | 'running'
  | 'succeeded'
  | 'failed'
  | 'cancelled';

/** A task's progress: `total` null when unknown. */
export interface ITaskProgress {
  completed: number | null;
  total: number | null;
  done?: boolean;
}

/** What an import job was asked for: the names of the files it imports. */
export interface IImportRequest {
  import: string[];
}

/** The body of `POST serve` (`workbench/server/serve_handlers.py`): a serving run against a running server. */
export interface IServeRequest {
  /** The http(s) URL of an OpenAI-compatible server. */
  url: string;
  /** A tokenizer folder, relative to the server's root folder. */
  tokenizer: string;
  /** The served model's name (default: the first the server lists). */
  model?: string;
  /** Open loop: requests per second, one load point each (give this or `concurrency`). */
  rate?: number[];
  /** Closed loop: requests in flight, one load point each. */
  concurrency?: number[];
  requests: number;
  isl: number;
  osl: number;
  /** Service-level objectives, as `workbench serve --slo` takes them: `ttft=200ms,tpot=50ms`. */
  slo?: string;
}

/** What a serving job was asked for. */
export interface IServeJobRequest {
  serve: IServeRequest;
}

/** One load point of a serving job's result: its run (null when the point failed whole) and headline figures. */
export interface IServePoint {
  load: string;
  run: string | null;
  summary: {
    requests?: number;
    ok?: number;
    failed?: number;
    [key: string]: unknown;
  } | null;
  error: string | null;
  warnings: string[];
}

/** What `workbench serve --json` prints: a serving job's result (also when some requests failed, exit 1). */
export interface IServeResult {
  experiment: string | null;
  runs: IServePoint[];
  sweep: { [key: string]: unknown } | null;
}

/** The body of `POST quant` (`workbench/server/quant_handlers.py`): the quantization lab on a model. */
export interface IQuantRequest {
  /** A built-in model (or one the server's policy allows). */
  model: string;
  /** A built-in's weights (default: trained where they exist). */
  weights?: 'trained' | 'random';
  /** The formats of the sensitivity scan, as `workbench quant --formats` takes them (default: the lab's). */
  formats?: string[];
  /** The recipes compared, as `--quant` takes them (default: the lab's). */
  recipes?: string[];
  /** An error budget for a mixed-precision plan: `sqnr=30`, `kl=0.01`. */
  budget?: string;
  /** The device of the hardware table the recipes' time is projected on. */
  device?: string;
  batch?: number;
  seq?: number;
  /** Time the recipes that have a real CPU kernel. */
  measure?: boolean;
}

/** What a quantization job was asked for. */
export interface IQuantJobRequest {
  quant: IQuantRequest;
}

/** What `workbench quant --json` prints: a quantization job's result (the lab's tables as rows). */
export interface IQuantResult {
  model: string;
  about: string;
  metric: string | null;
  device: string;
  recipes: { recipe: string; [key: string]: unknown }[];
  layers?: { layer: string; format: string; [key: string]: unknown }[];
  [key: string]: unknown;
}

/** The body of `POST replay` (`workbench/server/replay_handlers.py`): a run's top ops rebuilt and timed alone. */
export interface IReplayRequest {
  /** A run of the traces root. */
  run: string;
  /** The op signatures replayed, by self time (default 20). */
  top?: number;
  /** The variants each is timed under (default: all of `eager`, `bf16`, `compile`). */
  variants?: string[];
}

/** What a replay job was asked for. */
export interface IReplayJobRequest {
  replay: IReplayRequest;
}

/** One op signature of a replay (`workbench.replay.table`); null for a time or figure it has not. */
export interface IReplayRow {
  name: string;
  signature: string;
  calls: number;
  trace_ns: number;
  /** "ok" when some variant was timed, else "skipped". */
  status: string;
  /** Why it was not rebuilt, or what its rebuild assumed. */
  reason: string;
  [key: string]: unknown;
}

/** What `workbench replay --json` prints: a replay job's result. */
export interface IReplayResult {
  run: string;
  variants: string[];
  rows: IReplayRow[];
  [key: string]: unknown;
}

/**
 * The body of `POST project` (`workbench/server/project_handlers.py`): a model, a run or a model set projected onto
 * an accelerator (`workbench project`). Exactly one of `model`, `run`, `models`.
 */
export interface IProjectRequest {
  /** A built-in model (or one the server's policy allows): one forward of its example inputs. */
  model?: string;
  /** A run of the traces root: its measured steps' ops with recorded shapes. */
  run?: string;
  /** Short names of the model set, swept together. */
  models?: string[];
  /** A device of the hardware table, or a description file relative to the traces root. */
  accelerator: string;
  /** Sweeps as `--sweep` takes them: `bandwidth=0.5,1,2,4`, `array=64x64,128x128`. */
  sweeps?: string[];
  /** Project the graph at this precision. */
  dtype?: string;
  batch?: number;
  seq?: number;
}

/** What a projection job was asked for. */
export interface IProjectJobRequest {
  project: IProjectRequest;
}

/** What `workbench project --json` prints: one model's or run's projection, or a model set's sweeps. */
export interface IProjectResult {
  title: string;
  accelerator: string;
  /** One model or run: the projected step and its operators. */
  step_ns?: number;
  steps?: number;
  ops?: { name: string; time_ns: number; bound: string; [key: string]: unknown }[];
  guidance?: { title: string; gain_ns: number; [key: string]: unknown }[];
  /** A model set: each model's step as written. */
  models?: { model: string; step_ns: number }[];
  [key: string]: unknown;
}

/** The reply of `GET project/options`: what a projection form offers. */
export interface IProjectOptions {
  /** The hardware table's devices. */
  devices: string[];
  /** `--dtype`'s choices. */
  dtypes: string[];
  /** The sweep knobs (`rate.<dtype>` stands for one per dtype). */
  knobs: string[];
  /** The model set's short names. */
  model_set: string[];
  /** The built-in models. */
  models: string[];
}

/** A capture, import, serving, quantization, replay or projection job as `GET jobs/<id>` describes it. */
export interface IJob {
  id: string;
  status: JobStatus;
  request:
    | ICaptureRequest
    | IImportRequest
    | IServeJobRequest
    | IQuantJobRequest
    | IReplayJobRequest
    | IProjectJobRequest;
  created: string;
  started: string | null;
  finished: string | null;
  queue_position: number | null;
  progress: ITaskProgress & {
    task: string | null;
    tasks: { [task: string]: ITaskProgress };
  };
  log: string[];
  exit_code: number | null;
  /** What the command printed as JSON: a capture's or a serving run's result, or the run ids of an import. */
  result: ICaptureResult | IServeResult | IQuantResult | IReplayResult | IProjectResult | string[] | null;
  error: string | null;
}

/** Whether `job` imports files (the panel's uploads and "Open in Workbench") rather than capturing. */
export function isImportJob(job: IJob): job is IJob & { request: IImportRequest } {
  return Array.isArray((job.request as IImportRequest).import);
}

/** Whether `job` is a serving run (`POST serve`) rather than a capture or an import. */
export function isServeJob(job: IJob): job is IJob & { request: IServeJobRequest } {
  const serve = (job.request as IServeJobRequest).serve;
  return typeof serve === 'object' && serve !== null;
}

/** Whether `job` runs the quantization lab (`POST quant`). */
export function isQuantJob(job: IJob): job is IJob & { request: IQuantJobRequest } {
  const quant = (job.request as IQuantJobRequest).quant;
  return typeof quant === 'object' && quant !== null;
}

/** Whether `job` replays a run's top ops (`POST replay`). */
export function isReplayJob(job: IJob): job is IJob & { request: IReplayJobRequest } {
  const replay = (job.request as IReplayJobRequest).replay;
  return typeof replay === 'object' && replay !== null;
}

/** Whether `job` projects a model, a run or a model set onto an accelerator (`POST project`). */
export function isProjectJob(job: IJob): job is IJob & { request: IProjectJobRequest } {
  const project = (job.request as IProjectJobRequest).project;
  return typeof project === 'object' && project !== null;
}

/** The reply of `POST query`: the rows of one SELECT, at most its limit. */
export interface IQueryResult {
  columns: string[];
  /** Arrow's name of each column's type (`int64`, `string`, `double`...). */
  types: string[];
  rows: unknown[][];
  /** Whether the query had more rows than the limit. */
  truncated: boolean;
  /** The runs the query covered, as `GET runs` lists them. */
  runs: IRunRow[];
}

/** What `workbench capture --json` prints: the job's result once it succeeded. */
export interface ICaptureResult {
  experiment: string;
  root: string;
  runs: { run_id: string; status: string; [key: string]: unknown }[];
}

export type { ICaptureRequest };

/** One option of a capture job as `GET capture/options` describes it (`capture_fields.py`). */
export interface ICaptureField {
  key: keyof ICaptureRequest;
  /** Its JSON type; `array` is a list of strings. */
  type: 'string' | 'integer' | 'number' | 'boolean' | 'array' | 'object';
  /** Whether null is a value of its own (a missing option always takes the default). */
  nullable: boolean;
  default: unknown;
  minimum: number | null;
  maximum: number | null;
  /** The names it (or each of its items) must be one of: registered variants, profilers. */
  choices: string[] | null;
  /** Its `workbench capture` option. */
  flag: string;
  /** Whether a list of values is accepted too: a sweep (`batch`, `seq`). */
  sweep?: boolean;
}

/** The reply of `GET capture/options`: what a capture form offers. */
export interface ICaptureOptions {
  fields: ICaptureField[];
  variants: { name: string; backend: string; description: string }[];
  profilers: {
    name: string;
    description: string;
    tool: string | null;
    needs_cuda: boolean;
  }[];
  /** The devices of the server's machine (cpu, cuda:N). */
  devices: string[];
  /** The built-in models. */
  /** What the model picker offers: built-ins, hf-config: presets, common torchvision/timm models. */
  models: string[];
  /** The built-in models alone. */
  builtin_models: string[];
}

/** A Bokeh `json_item`, embedded with `Bokeh.embed.embed_item`. */
export interface IBokehItem {
  target_id: string | null;
  root_id: string;
  doc: { version: string; [key: string]: unknown };
  version?: string;
}

/** The traces root of the server (`GET`/`PUT config`). */
export interface IServerConfig {
  traces_root: string;
  default_traces_root: string;
}

/**
 * Call the API at `path` (relative to `workbench/api/`) and return its JSON reply.
 */
export async function requestAPI<T>(
  path: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const response = await send(path, init, settings);
  const text = await response.text();
  let data: any = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = undefined;
    }
  }
  if (!response.ok) {
    const message =
      typeof data?.message === 'string'
        ? data.message
        : `${response.status} ${response.statusText || 'error'} from ${path}` +
          (response.status === 404 && data === undefined
            ? ' (is the workbench server extension enabled? see `jupyter server extension list`)'
            : '');
    throw new WorkbenchApiError(message, response.status);
  }
  if (data === undefined) {
    throw new WorkbenchApiError(
      `the server's reply to ${path} is not JSON`,
      response.status
    );
  }
  return data as T;
}

/** The server's response to `path` (relative to `workbench/api/`), whatever its status. */
async function send(path: string, init: RequestInit, settings: ServerConnection.ISettings): Promise<Response> {
  const url = URLExt.join(settings.baseUrl, API_PATH, path);
  try {
    return await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new WorkbenchApiError(
      `cannot reach the Jupyter server: ${(error as Error).message ?? error}`,
      0
    );
  }
}

function jsonBody(method: string, body: unknown): RequestInit {
  return {
    method,
    body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json' }
  };
}

function runPath(runId: string): string {
  return `runs/${encodeURIComponent(runId)}`;
}

/** The trace file formats a run exports to (`workbench export`): Perfetto's protobuf, or Chrome Trace Event JSON. */
export type ExportFormat = 'perfetto' | 'chrome';

/**
 * A run written as a trace file (`GET runs/<id>/export`), with its typical step's critical path as a track of its
 * own when `criticalPath`: its bytes and the file name the server gives it (`<run>.perfetto-trace`, `<run>.json`).
 * A failure is the server's own message.
 */
export async function fetchRunExport(
  runId: string,
  format: ExportFormat,
  criticalPath = false,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<{ blob: Blob; fileName: string }> {
  const path = `${runPath(runId)}/export?format=${format}` + (criticalPath ? '&critical_path=1' : '');
  const response = await send(path, {}, settings);
  if (!response.ok) {
    let message = `${response.status} ${response.statusText || 'error'} from ${path}`;
    try {
      const data = await response.json();
      message = typeof data?.message === 'string' ? data.message : message;
    } catch {
      // not JSON: the status says it
    }
    throw new WorkbenchApiError(message, response.status);
  }
  const named = /filename="([^"]+)"/.exec(response.headers.get('Content-Disposition') ?? '');
  return { blob: await response.blob(), fileName: named ? named[1] : `${runId}.${format === 'chrome' ? 'json' : 'perfetto-trace'}` };
}

/** The runs and experiments of the server's traces root. */
export function listRuns(): Promise<IListing> {
  return requestAPI<IListing>('runs');
}

/** Delete a run's bundle from disk. */
export function deleteRun(runId: string): Promise<{ deleted: string }> {
  return requestAPI(runPath(runId), { method: 'DELETE' });
}

/** A run's dashboard laid out `width` pixels wide. */
export async function fetchDashboard(
  runId: string,
  width: number
): Promise<IBokehItem> {
  const reply = await requestAPI<{ item: IBokehItem }>(
    `${runPath(runId)}/dashboard?width=${width}`
  );
  return reply.item;
}

/**
 * The comparison of two or more runs laid out `width` pixels wide, against `baseline` (one of them; null: the
 * server's rule, the reference variant when one ran it, else the first run).
 */
export async function fetchComparison(
  runIds: string[],
  width: number,
  baseline: string | null = null
): Promise<IBokehItem> {
  const body: { runs: string[]; width: number; baseline?: string } = { runs: runIds, width };
  if (baseline !== null) {
    body.baseline = baseline;
  }
  const reply = await requestAPI<{ item: IBokehItem }>('compare', jsonBody('POST', body));
  return reply.item;
}

/** The options a capture job takes, with their defaults, bounds and choices. */
export function fetchCaptureOptions(): Promise<ICaptureOptions> {
  return requestAPI<ICaptureOptions>('capture/options');
}

/** Start (or queue) a capture job. */
export function startCapture(request: ICaptureRequest): Promise<IJob> {
  return requestAPI<IJob>('jobs', jsonBody('POST', request));
}

/** Start (or queue) a serving run against a running server (`workbench serve --url`). */
export function startServe(request: IServeRequest): Promise<IJob> {
  return requestAPI<IJob>('serve', jsonBody('POST', request));
}

/** Start (or queue) the quantization lab on a model (`workbench quant`). */
export function startQuant(request: IQuantRequest): Promise<IJob> {
  return requestAPI<IJob>('quant', jsonBody('POST', request));
}

/** The views of a succeeded quantization job laid out `width` pixels wide. */
export async function fetchQuantView(jobId: string, width: number): Promise<IBokehItem> {
  const reply = await requestAPI<{ item: IBokehItem }>(`quant/${encodeURIComponent(jobId)}/view?width=${width}`);
  return reply.item;
}

/** Start (or queue) the replay of a run's top ops (`workbench replay`). */
export function startReplay(request: IReplayRequest): Promise<IJob> {
  return requestAPI<IJob>('replay', jsonBody('POST', request));
}

/** The view of a succeeded replay job laid out `width` pixels wide. */
export async function fetchReplayView(jobId: string, width: number): Promise<IBokehItem> {
  const reply = await requestAPI<{ item: IBokehItem }>(`replay/${encodeURIComponent(jobId)}/view?width=${width}`);
  return reply.item;
}

/** What a projection form offers: devices, dtypes, sweep knobs, the model set. */
export function fetchProjectOptions(): Promise<IProjectOptions> {
  return requestAPI<IProjectOptions>('project/options');
}

/** Start (or queue) a projection onto an accelerator (`workbench project`). */
export function startProject(request: IProjectRequest): Promise<IJob> {
  return requestAPI<IJob>('project', jsonBody('POST', request));
}

/** The report of a succeeded projection job laid out `width` pixels wide. */
export async function fetchProjectView(jobId: string, width: number): Promise<IBokehItem> {
  const reply = await requestAPI<{ item: IBokehItem }>(`project/${encodeURIComponent(jobId)}/view?width=${width}`);
  return reply.item;
}

/** Every capture job the server knows, oldest first. */
export async function listJobs(): Promise<IJob[]> {
  return (await requestAPI<{ jobs: IJob[] }>('jobs')).jobs;
}

/** One job's status. */
export function getJob(jobId: string): Promise<IJob> {
  return requestAPI<IJob>(`jobs/${encodeURIComponent(jobId)}`);
}

/** Cancel a job; resolves with its final status once it has stopped. */
export function cancelJob(jobId: string): Promise<IJob> {
  return requestAPI<IJob>(`jobs/${encodeURIComponent(jobId)}`, {
    method: 'DELETE'
  });
}

/** Make the server read and capture into `tracesRoot` ('' restores the server's configured root). */
export function setTracesRoot(tracesRoot: string): Promise<IServerConfig> {
  return requestAPI<IServerConfig>(
    'config',
    jsonBody('PUT', { traces_root: tracesRoot })
  );
}

/** Whether a job has ended (successfully or not). */
export function isFinished(job: IJob): boolean {
  return (
    job.status === 'succeeded' ||
    job.status === 'failed' ||
    job.status === 'cancelled'
  );
}

/** Run one read-only SQL SELECT over `runIds` (every run of the traces root when null). */
export function runQuery(
  sql: string,
  runIds: string[] | null,
  limit?: number
): Promise<IQueryResult> {
  const body: { sql: string; runs?: string[]; limit?: number } = { sql };
  if (runIds !== null) {
    body.runs = runIds;
  }
  if (limit !== undefined) {
    body.limit = limit;
  }
  return requestAPI<IQueryResult>('query', jsonBody('POST', body));
}

/** Upload a trace file into the traces root; resolves with the job that imports it. */
export function uploadTrace(file: File): Promise<IJob> {
  return requestAPI<IJob>(`upload?name=${encodeURIComponent(file.name)}`, {
    method: 'POST',
    body: file,
    headers: { 'Content-Type': 'application/octet-stream' }
  });
}

/** Import a file of the server's root folder (a path as Lab's file browser gives it); resolves with the job. */
export function importPath(path: string): Promise<IJob> {
  return requestAPI<IJob>('import', jsonBody('POST', { path }));
}

/** A token that changes whenever runs or experiments appear in or vanish from the traces root. */
export async function tracesVersion(): Promise<string> {
  return (await requestAPI<{ version: string }>('traces/version')).version;
}
