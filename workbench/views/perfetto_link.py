""""Open in Perfetto": a report's links to the Perfetto traces written beside it (`workbench.export`), each a
download and a button that opens ui.perfetto.dev with the trace.

The button follows Perfetto's documented deep-linking protocol (perfetto.dev/docs/visualization/deep-linking-to-
perfetto-ui): open the UI with `window.open` in the click itself (so no popup blocker stops it), post `'PING'`
until the UI answers `'PONG'`, then post `{perfetto: {buffer, title, fileName}}`. The trace's bytes come from
the copy embedded in the page when it is small enough (a report opened from disk cannot fetch a file beside it),
else from the file beside the report, which a page served over HTTP (Jupyter's file server) can fetch.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from urllib.parse import quote

from bokeh.layouts import column, row
from bokeh.models import Button, CustomJS, Div, LayoutDOM

PERFETTO_UI = "https://ui.perfetto.dev"

_OPEN = """
const win = window.open(origin);
if (!win) { alert("The browser blocked the Perfetto UI's window: allow pop-ups, or download " + href); return; }
const load = embedded
    ? Promise.resolve(Uint8Array.from(atob(embedded), (c) => c.charCodeAt(0)).buffer)
    : fetch(href).then((r) => {
        if (!r.ok) { throw new Error(r.status + " " + r.statusText); }
        return r.arrayBuffer();
    });
load.then((buffer) => {
    const timer = setInterval(() => win.postMessage("PING", origin), 50);
    const answer = (event) => {
        if (event.source !== win || event.data !== "PONG") { return; }
        clearInterval(timer);
        window.removeEventListener("message", answer);
        win.postMessage({perfetto: {buffer: buffer, title: title, fileName: file}}, origin);
    };
    window.addEventListener("message", answer);
}).catch((error) => {
    win.close();
    alert("Could not read " + href + " (" + error + "): download it and open it in " + origin);
});
"""


@dataclass(frozen=True)
class PerfettoTrace:
    """One run's trace written beside a report: its run's name, the file's name (relative to the report), and its
    bytes when they are embedded in the page."""

    run: str
    file: str
    embedded: bytes | None


def perfetto_links(traces: list[PerfettoTrace]) -> LayoutDOM:
    """A row per trace: a download link and an "Open in Perfetto" button (names escaped)."""
    rows = []
    for trace in traces:
        href = quote(trace.file)
        link = Div(text=f'<a href="{html.escape(href)}" download>{html.escape(trace.file)}</a>: the Perfetto trace '
                        f"of run {html.escape(trace.run)}")
        button = Button(label=f"Open {trace.run} in Perfetto", width=260)
        embedded = base64.b64encode(trace.embedded).decode("ascii") if trace.embedded is not None else ""
        button.js_on_event("button_click", CustomJS(args={"origin": PERFETTO_UI, "href": href, "file": trace.file,
                                                          "title": f"workbench: {trace.run}", "embedded": embedded},
                                                    code=_OPEN))
        rows.append(row(button, link))
    return column(*rows)
