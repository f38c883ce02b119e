/**
 * BokehJS, loaded once per page from the server's static route, and embedding of `json_item`s.
 *
 * The server serves the BokehJS of its own bokeh package (`<base_url>/workbench/static/bokeh/js/`), so
 * the JavaScript always matches the Python that built the items. BokehJS registers itself as
 * `window.Bokeh[version]` (beside any other version a notebook may have loaded); its widgets and tables
 * bundles register into that same version. Script tags carry the server's auth cookie.
 */

import { URLExt } from '@jupyterlab/coreutils';

import { IBokehItem } from './api';

/** The part of a BokehJS ViewManager (what `embed_item` resolves to) this extension uses. */
export interface IBokehViews {
  roots: { model: { document: unknown } }[];
  clear(): void;
}

/** The part of the BokehJS global this extension uses. */
export interface IBokeh {
  version: string;
  documents: unknown[];
  embed: {
    embed_item(item: IBokehItem, target: HTMLElement): Promise<IBokehViews>;
  };
  Widgets?: unknown;
  Tables?: unknown;
}

declare global {
  interface Window {
    Bokeh?: { [version: string]: IBokeh | any } & Partial<IBokeh>;
  }
}

/** The bundles a workbench layout needs, in load order: core, widgets (Div, Tabs' controls), tables. */
const BUNDLES: { file: string; has: (bokeh: IBokeh) => boolean }[] = [
  { file: 'bokeh-widgets.min.js', has: bokeh => bokeh.Widgets !== undefined },
  { file: 'bokeh-tables.min.js', has: bokeh => bokeh.Tables !== undefined }
];

const loading = new Map<string, Promise<IBokeh>>();

/** The URL of a BokehJS file on the server whose base URL is `baseUrl`. */
export function bokehUrl(baseUrl: string, file: string): string {
  return URLExt.join(baseUrl, 'workbench/static/bokeh/js', file);
}

function addScript(url: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const script = document.createElement('script');
    script.src = url;
    script.async = false;
    script.onload = () => resolve();
    script.onerror = () =>
      reject(new Error(`BokehJS could not be loaded from ${url}`));
    document.head.appendChild(script);
  });
}

function installed(version: string): IBokeh | undefined {
  const bokeh = window.Bokeh?.[version];
  return bokeh && bokeh.embed ? (bokeh as IBokeh) : undefined;
}

async function load(baseUrl: string, version: string): Promise<IBokeh> {
  if (!installed(version)) {
    await addScript(bokehUrl(baseUrl, 'bokeh.min.js'));
  }
  const bokeh = installed(version);
  if (!bokeh) {
    const found = window.Bokeh?.version ?? 'none';
    throw new Error(
      `the server's BokehJS is not version ${version}, the version of its plots (found: ${found})`
    );
  }
  for (const bundle of BUNDLES) {
    if (!bundle.has(bokeh)) {
      await addScript(bokehUrl(baseUrl, bundle.file));
    }
  }
  return bokeh;
}

/**
 * BokehJS `version` with its widgets and tables, loading the scripts the first time it is asked for.
 * A failed load is forgotten, so a later call tries again.
 */
export function loadBokeh(baseUrl: string, version: string): Promise<IBokeh> {
  const key = `${baseUrl} ${version}`;
  let promise = loading.get(key);
  if (!promise) {
    promise = load(baseUrl, version);
    loading.set(key, promise);
    promise.catch(() => loading.delete(key));
  }
  return promise;
}

/** An embedded item: its views and documents, removed again by `dispose`. */
export class EmbeddedItem {
  constructor(
    private readonly _bokeh: IBokeh,
    private readonly _views: IBokehViews
  ) {}

  /** The BokehJS Document of the embedded item (its models, found by name). */
  get document(): any {
    return this._views.roots[0]?.model.document;
  }

  /** Remove the views and forget their documents (Bokeh keeps every document in `Bokeh.documents`). */
  dispose(): void {
    const documents = new Set(this._views.roots.map(view => view.model.document));
    this._views.clear();
    for (const doc of documents) {
      const index = this._bokeh.documents.indexOf(doc);
      if (index >= 0) {
        this._bokeh.documents.splice(index, 1);
      }
    }
  }
}

/** Embed `item` into `target` with the server's BokehJS. */
export async function embedItem(
  baseUrl: string,
  item: IBokehItem,
  target: HTMLElement
): Promise<EmbeddedItem> {
  const bokeh = await loadBokeh(baseUrl, item.doc.version);
  return new EmbeddedItem(bokeh, await bokeh.embed.embed_item(item, target));
}
