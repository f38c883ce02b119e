/**
 * The Workbench JupyterLab extension: a left sidebar of runs and captures, main-area dashboards and
 * comparisons, a run's op replay (from its dashboard's toolbar or the runs list), projections onto an accelerator
 * (from the sidebar's co-design section or a dashboard's toolbar), command-palette and launcher entries, the traces folder setting, and "Open in Workbench" on trace files in Lab's file browser (imported by the
 * server, then opened).
 *
 * The setting `tracesRoot` is sent to the server (`PUT workbench/api/config`) when Lab starts and each
 * time it changes; the server then lists, captures into and deletes from that folder.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  MainAreaWidget,
  showErrorMessage,
  ToolbarButton,
  WidgetTracker
} from '@jupyterlab/apputils';
import { ILauncher } from '@jupyterlab/launcher';
import { ServerConnection } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { refreshIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { ExportFormat, IJob, IRunRow } from './api';
import { workbenchIcon } from './icon';
import { IQueryShown, QueryResultView } from './queryView';
import { runLabel } from './runs';
import { WorkbenchSidebar } from './sidebar';
import { downloadExport, openInPerfetto } from './perfetto';
import { ProjectPanel, projectTitle } from './project';
import { quantTitle } from './quant';
import { ReplayPanel } from './replay';
import { BokehView, quantSource, viewSource } from './view';

const PLUGIN_ID = 'jupyterlab-workbench:plugin';

/** The extension's commands. */
export namespace CommandIDs {
  export const open = 'workbench:open';
  export const show = 'workbench:show-runs';
  export const refresh = 'workbench:refresh';
  export const openFile = 'workbench:open-file';
}

/** Names of the files "Open in Workbench" is offered for: what `workbench import` reads. */
export const TRACE_FILE = /\.(json|gz|pb|sqlite)$/i;

/** The id of the main-area view of `runs` (against `baseline`, which no run id can be confused with). */
export function viewId(runs: string[], baseline: string | null): string {
  return `workbench-view-${runs.join('+')}` + (baseline ? `@${baseline}` : '');
}

/**
 * A view's tab title: the run's model, name and batch (its file for an import), or the number compared and the
 * baseline chosen.
 */
function viewTitle(runs: string[], baseline: string | null, rows: Map<string, IRunRow>): string {
  if (runs.length === 1) {
    return runLabel(rows.get(runs[0]), runs[0]);
  }
  return `Compare ${runs.length} runs` + (baseline ? ` against ${runLabel(rows.get(baseline), baseline)}` : '');
}

/** The paths of the items selected in Lab's default file browser (found by its id, without its package). */
function selectedFiles(app: JupyterFrontEnd): string[] {
  const browser = Array.from(app.shell.widgets('left')).find(widget => widget.id === 'filebrowser') as any;
  const items = browser?.selectedItems?.();
  return items ? Array.from(items as Iterable<{ path: string; type: string }>)
    .filter(item => item.type !== 'directory')
    .map(item => item.path) : [];
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The Workbench panel: runs, captures, dashboards and comparisons.',
  autoStart: true,
  optional: [ICommandPalette, ILauncher, ISettingRegistry, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    launcher: ILauncher | null,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null
  ) => {
    const { commands, shell } = app;
    const baseUrl = ServerConnection.makeSettings().baseUrl;
    const tracker = new WidgetTracker<MainAreaWidget<BokehView>>({
      namespace: 'workbench-view'
    });
    /** The runs as last listed by the sidebar, for the views' titles. */
    const rows = new Map<string, IRunRow>();

    /**
     * Open (or bring forward) the main-area tab `id`, made by `make` when it is not open: a job's tab (its form or
     * progress, then its view) with a "Draw again" button. Not restored with the layout: a job's results live as
     * long as the server's job list.
     */
    const showJobTab = (
      id: string, label: string, caption: string, make: () => Widget & { refresh(): void }
    ): void => {
      const open = Array.from(shell.widgets('main')).find(widget => widget.id === id);
      if (open) {
        shell.activateById(id);
        return;
      }
      const content = make();
      const widget = new MainAreaWidget({ content });
      widget.id = id;
      widget.addClass('jp-Workbench-viewPanel');
      widget.title.label = label;
      widget.title.caption = caption;
      widget.title.icon = workbenchIcon;
      widget.title.closable = true;
      widget.toolbar.addItem(
        'refresh',
        new ToolbarButton({ icon: refreshIcon, tooltip: 'Draw again', onClick: () => content.refresh() })
      );
      shell.add(widget, 'main');
      shell.activateById(id);
    };

    /** The op replay tab of a run: its form, its job, then its view. */
    const showReplay = (run: string): void =>
      showJobTab(`workbench-replay-${run}`, `Op replay: ${runLabel(rows.get(run), run)}`,
        `Op replay of run ${run}`, () => new ReplayPanel(run, baseUrl));

    /** The tab of a projection job: its progress, then its report. */
    const showProject = (job: IJob): void =>
      showJobTab(`workbench-project-${job.id}`, projectTitle(job, run => runLabel(rows.get(run), run)),
        `${projectTitle(job)} (job ${job.id})`, () => new ProjectPanel(job, baseUrl));

    /** Open (or bring forward) the dashboard of one run, or the comparison of several (against `baseline`). */
    const show = (runs: string[], baseline: string | null = null): MainAreaWidget<BokehView> => {
      const id = viewId(runs, baseline);
      const open = tracker.find(widget => widget.id === id);
      if (open) {
        shell.activateById(open.id);
        return open;
      }
      const content = new BokehView(viewSource(runs, baseline), baseUrl);
      const widget = new MainAreaWidget({ content });
      widget.id = id;
      widget.addClass('jp-Workbench-viewPanel');
      widget.title.label = viewTitle(runs, baseline, rows);
      widget.title.caption = runs.join('\n') + (baseline ? `\nbaseline: ${baseline}` : '');
      widget.title.icon = workbenchIcon;
      widget.title.closable = true;
      widget.toolbar.addItem(
        'refresh',
        new ToolbarButton({
          icon: refreshIcon,
          tooltip: 'Draw again from the run bundles',
          onClick: () => void content.refresh()
        })
      );
      if (runs.length === 1) {
        const run = runs[0];
        widget.toolbar.addItem(
          'replay',
          new ToolbarButton({
            label: 'Replay ops',
            className: 'jp-Workbench-replayButton',
            tooltip: "Rebuild this run's top ops from the shapes its trace recorded and time each alone " +
              '(eager, bf16, compiled), beside the trace\'s time',
            onClick: () => showReplay(run)
          })
        );
        widget.toolbar.addItem(
          'project',
          new ToolbarButton({
            label: 'Co-design',
            className: 'jp-Workbench-projectButton',
            tooltip: "Co-design: project this run's ops (from their recorded shapes) onto a device of the hardware " +
              'table or a description of your chip, with sweeps of its knobs',
            onClick: () => {
              sidebar.projectRun(run);
              shell.activateById(sidebar.id);
            }
          })
        );
        const download = (format: ExportFormat) =>
          downloadExport(run, format).catch(error => showErrorMessage(`Cannot export run ${run}`, error));
        widget.toolbar.addItem(
          'perfetto-download',
          new ToolbarButton({
            label: 'Download for Perfetto',
            className: 'jp-Workbench-exportButton',
            tooltip: `Download this run as a Perfetto trace (${run}.perfetto-trace): lanes, launch → kernel flows, ` +
              'counters and steps, for ui.perfetto.dev',
            onClick: () => void download('perfetto')
          })
        );
        widget.toolbar.addItem(
          'chrome-download',
          new ToolbarButton({
            label: 'Chrome JSON',
            className: 'jp-Workbench-chromeButton',
            tooltip: `Download this run as Chrome Trace Event JSON (${run}.json), for chrome://tracing and tools ` +
              'that read PyTorch profiler traces',
            onClick: () => void download('chrome')
          })
        );
        widget.toolbar.addItem(
          'perfetto-open',
          new ToolbarButton({
            label: 'Open in Perfetto UI',
            className: 'jp-Workbench-perfettoButton',
            tooltip: 'Open this run in ui.perfetto.dev (a new tab; the trace goes to it from this page, and Perfetto ' +
              'UI reads it in the browser)',
            onClick: () =>
              void openInPerfetto(run, `workbench: ${runLabel(rows.get(run), run)}`).catch(error =>
                showErrorMessage(`Cannot open run ${run} in Perfetto UI`, error))
          })
        );
      }
      void tracker.add(widget);
      shell.add(widget, 'main');
      shell.activateById(widget.id);
      return widget;
    };

    /**
     * Open (or bring forward) the views of a succeeded quantization job. Not restored with the layout: the lab's
     * results live as long as the server's job list.
     */
    const showQuant = (job: IJob): void => {
      const id = `workbench-quant-${job.id}`;
      const open = Array.from(shell.widgets('main')).find(widget => widget.id === id);
      if (open) {
        shell.activateById(id);
        return;
      }
      const content = new BokehView(quantSource(job.id), baseUrl);
      const widget = new MainAreaWidget({ content });
      widget.id = id;
      widget.addClass('jp-Workbench-viewPanel');
      widget.title.label = quantTitle(job);
      widget.title.caption = `${quantTitle(job)} (job ${job.id})`;
      widget.title.icon = workbenchIcon;
      widget.title.closable = true;
      widget.toolbar.addItem(
        'refresh',
        new ToolbarButton({ icon: refreshIcon, tooltip: 'Draw again', onClick: () => void content.refresh() })
      );
      shell.add(widget, 'main');
      shell.activateById(id);
    };

    /** The main-area view of the latest query's result: one, reused by each query while it is open. */
    let queryPanel: MainAreaWidget<QueryResultView> | null = null;
    const showQuery = (shown: IQueryShown): void => {
      if (queryPanel === null || queryPanel.isDisposed) {
        queryPanel = new MainAreaWidget({ content: new QueryResultView() });
        queryPanel.id = 'workbench-query-result';
        queryPanel.title.label = 'SQL result';
        queryPanel.title.icon = workbenchIcon;
        queryPanel.title.closable = true;
        shell.add(queryPanel, 'main');
      }
      queryPanel.content.setResult(shown);
      queryPanel.title.caption = shown.sql;
      shell.activateById(queryPanel.id);
    };

    const sidebar = new WorkbenchSidebar({
      open: runs => runs.forEach(run => show([run])),
      compare: (runs, baseline) => show(runs, baseline),
      showQuant,
      showReplay,
      showProject,
      showQuery,
      deleted: runs =>
        tracker.forEach(widget => {
          if (widget.content.runs.some(run => runs.includes(run))) {
            widget.dispose();
          }
        }),
      listed: listedRows => {
        rows.clear();
        listedRows.forEach(row => rows.set(row.run, row));
        tracker.forEach(widget => {
          widget.title.label = viewTitle(widget.content.runs, widget.content.source.baseline, rows);
        });
      }
    });
    shell.add(sidebar, 'left', { rank: 850 });

    commands.addCommand(CommandIDs.open, {
      label: 'Workbench',
      caption: 'Open the Workbench panel: runs, captures, dashboards',
      icon: args => (args['isPalette'] ? undefined : workbenchIcon),
      execute: () => shell.activateById(sidebar.id)
    });
    commands.addCommand(CommandIDs.show, {
      label: args => {
        const runs = (args['runs'] as string[] | undefined) ?? [];
        return runs.length > 1 ? 'Compare Workbench Runs' : 'Open Workbench Run';
      },
      execute: args => {
        const runs = (args['runs'] as string[] | undefined) ?? [];
        if (runs.length === 0) {
          throw new Error(`${CommandIDs.show} needs {"runs": [run ids], "baseline"?: run id}`);
        }
        return show(runs, (args['baseline'] as string | null | undefined) ?? null);
      }
    });
    commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh Workbench Runs',
      execute: () => sidebar.refresh()
    });
    commands.addCommand(CommandIDs.openFile, {
      label: 'Open in Workbench',
      caption: 'Import the trace file into the Workbench traces folder and open its dashboard',
      icon: workbenchIcon,
      isVisible: () => selectedFiles(app).some(path => TRACE_FILE.test(path)),
      execute: args => {
        const paths = (args['paths'] as string[] | undefined) ?? selectedFiles(app).filter(p => TRACE_FILE.test(p));
        sidebar.imports.importPaths(paths);
        shell.activateById(sidebar.id);
      }
    });
    app.contextMenu.addItem({
      command: CommandIDs.openFile,
      selector: '.jp-DirListing-item[data-isdir="false"]',
      rank: 3
    });

    if (palette) {
      palette.addItem({ command: CommandIDs.open, category: 'Workbench', args: { isPalette: true } });
      palette.addItem({ command: CommandIDs.refresh, category: 'Workbench' });
    }
    if (launcher) {
      launcher.add({ command: CommandIDs.open, category: 'Other', rank: 1 });
    }
    if (restorer) {
      restorer.add(sidebar, 'workbench-sidebar');
      void restorer.restore(tracker, {
        command: CommandIDs.show,
        args: widget => ({ runs: widget.content.runs, baseline: widget.content.source.baseline }),
        name: widget => widget.id.replace(/^workbench-view-/, '')
      });
    }
    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => void sidebar.setTracesRoot((settings.get('tracesRoot').composite as string) ?? '');
          settings.changed.connect(apply);
          apply();
        })
        .catch(reason => {
          console.error(`Workbench: cannot load the settings of ${PLUGIN_ID}`, reason);
        });
    }
  }
};

export default plugin;
