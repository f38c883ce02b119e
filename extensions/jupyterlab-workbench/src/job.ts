/**
 * Following a job of the server's queue from a sidebar section (capture, serving): starting it, polling it
 * every `POLL_MS` until it ends, cancelling it, and picking a running one back up after the page was reloaded.
 * Each section keeps only its form; the job's life is the same for all. A main-area tab watches a job it did not
 * start (`useWatchedJob`).
 */

import * as React from 'react';

import { cancelJob, getJob, IJob, isFinished, listJobs, WorkbenchApiError } from './api';

/** How often a running job is polled. */
export const POLL_MS = 500;

/** An error's message for the user. */
export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

export interface IFollowedJob {
  /** The job followed: running, or ended and shown until dismissed or replaced. */
  job: IJob | null;
  running: boolean;
  error: string | null;
  submitting: boolean;
  cancelling: boolean;
  /** Forget an ended job (its outcome is dismissed). */
  dismiss: () => void;
  /** Build a request (a thrown error is shown), send it, and follow the job it starts. */
  submit: <T>(build: () => T | Promise<T>, send: (request: T) => Promise<IJob>) => Promise<void>;
  cancel: () => Promise<void>;
}

/**
 * The job a section follows. `what` names it in messages ("the capture"); `isMine` picks, after a reload, the
 * running job of the server that is this section's, which `onResume` shows (its form); `onFinished` runs once
 * when a followed job ends.
 */
export function useFollowedJob(options: {
  what: string;
  isMine: (job: IJob) => boolean;
  onResume: (job: IJob) => void;
  onFinished: (job: IJob) => void;
}): IFollowedJob {
  const [job, setJob] = React.useState<IJob | null>(null);
  const followed = React.useRef<IJob | null>(null);
  followed.current = job;
  const [error, setError] = React.useState<string | null>(null);
  const [submitting, setSubmitting] = React.useState(false);
  const [cancelling, setCancelling] = React.useState(false);
  const latest = React.useRef(options);
  latest.current = options;
  const reported = React.useRef(new Set<string>());
  /** Tell the section once that `ended` has ended (polling and cancelling may both see it). */
  const finish = (ended: IJob) => {
    if (!reported.current.has(ended.id)) {
      reported.current.add(ended.id);
      latest.current.onFinished(ended);
    }
  };

  // Follow a job of this section still running on the server (started before this page was loaded).
  React.useEffect(() => {
    listJobs()
      .then(jobs => {
        const live = jobs.filter(j => !isFinished(j) && latest.current.isMine(j)).pop();
        if (live && followed.current === null) {
          setJob(live);
          latest.current.onResume(live);
        }
      })
      .catch(() => {
        // the runs list shows why the server cannot be reached
      });
  }, []);

  usePolledJob(job, latest.current.what, setError, {
    next: next => {
      setJob(next);
      if (isFinished(next)) {
        setCancelling(false);
        finish(next);
      }
    },
    gone: () => setJob(null)
  });

  const submit = async <T>(build: () => T | Promise<T>, send: (request: T) => Promise<IJob>) => {
    setError(null); // a new attempt: the last one's error and outcome go
    setJob(current => (current && isFinished(current) ? null : current));
    let request: T;
    try {
      request = await build();
    } catch (err) {
      setError(errorMessage(err));
      return;
    }
    setSubmitting(true);
    try {
      setJob(await send(request));
    } catch (err) {
      setError(errorMessage(err));
    } finally {
      setSubmitting(false);
    }
  };

  const cancel = async () => {
    if (!job) {
      return;
    }
    setCancelling(true);
    try {
      const ended = await cancelJob(job.id);
      setJob(ended);
      finish(ended);
    } catch (err) {
      setError(`cannot cancel: ${errorMessage(err)}`);
    } finally {
      setCancelling(false);
    }
  };

  return {
    job,
    running: job !== null && !isFinished(job),
    error,
    submitting,
    cancelling,
    dismiss: () => setJob(null),
    submit,
    cancel
  };
}

/**
 * A job started elsewhere, watched until it ends (a main-area tab showing a job's progress): `job` as last polled,
 * `error` when the server cannot be asked (retried) or no longer knows it.
 */
export function useWatchedJob(started: IJob): { job: IJob; error: string | null } {
  const [job, setJob] = React.useState<IJob>(started);
  const [error, setError] = React.useState<string | null>(null);
  usePolledJob(job, 'the job', setError, { next: setJob, gone: () => undefined });
  return { job, error };
}

/**
 * Poll `job` every `POLL_MS` until it ends: each answer goes to `on.next` (and clears the error); a job the server
 * no longer knows (404) to `on.gone`, with an error saying so; any other failure is shown (`what` names the job)
 * and retried.
 */
function usePolledJob(
  job: IJob | null,
  what: string,
  setError: (error: string | null) => void,
  on: { next: (job: IJob) => void; gone: () => void }
): void {
  const [retry, setRetry] = React.useState(0);
  const latest = React.useRef({ what, on });
  latest.current = { what, on };
  React.useEffect(() => {
    if (!job || isFinished(job)) {
      return;
    }
    let stopped = false;
    const timer = window.setTimeout(async () => {
      try {
        const next = await getJob(job.id);
        if (stopped) {
          return;
        }
        setError(null);
        latest.current.on.next(next);
      } catch (err) {
        if (stopped) {
          return;
        }
        if (err instanceof WorkbenchApiError && err.status === 404) {
          latest.current.on.gone();
          setError(`the server no longer knows job ${job.id} (was it restarted?)`);
        } else {
          setError(`cannot follow ${latest.current.what}: ${errorMessage(err)}; retrying`);
          setRetry(n => n + 1);
        }
      }
    }, POLL_MS);
    return () => {
      stopped = true;
      window.clearTimeout(timer);
    };
  }, [job, retry]);
}
