"""Perfetto's protobuf trace format (a `Trace` message: length-delimited `TracePacket`s): the field numbers of the
part of its published schema the workbench reads and writes (`fields`), the protobuf wire decoding (`wire`) and the
reader of TrackEvent traces (`reader`). The writer is `workbench.export.perfetto`."""
