"""Export: a bundle written as a trace file that Perfetto UI, chrome://tracing and our own readers open with the
same lanes, names, launch → kernel flows, counters and step markers.

- `source`: the bundle's tables and the plan both formats share (lanes, flows, correlation ids);
- `categories`: the Kineto category each event kind is written under;
- `chrome`: Chrome Trace Event JSON, streamed (small runs, chrome://tracing);
- `protowire`, `perfetto`: Perfetto's protobuf TrackEvent format, packet by packet (large runs); the encoder is
  our own, not protobuf's generated classes (see `protowire` for why);
- `run`: `export_run(run_dir, fmt, out)`, atomic, with its summary (what `workbench export --json` prints).

`workbench import` reads either format back (`trace.kineto`, `trace.perfetto`).
"""

from workbench.export.run import FORMATS, export_run

__all__ = ["FORMATS", "export_run"]
