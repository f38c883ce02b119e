"""Op replay: a trace's heaviest framework ops rebuilt as standalone calls and timed in isolation.

torch.profiler with `record_shapes=True` writes each op's inputs into its Kineto args (`Input Dims`, `Input type`,
`Input Strides`, `Concrete Inputs`; the reader keeps them in the events' `shapes`, `dtypes` and `args` columns).
That is enough to call the op again, alone, on tensors of the same shapes, dtypes, strides and device, and to set
its time in isolation beside the time it took inside the model.

- `calls`: the recorded inputs of one call as argument specs (no torch);
- `signatures`: a trace's op calls grouped by signature (name and recorded inputs), ranked by self time (no torch);
- `rebuild`: a signature as a callable op with tensors, under a variant (eager, bf16, compile) (torch);
- `table`: the replay of a run's top signatures as one DataFrame (torch, loaded only by the replay surfaces).

Nothing here is imported by the trace commands: only `rebuild` and `table` import torch, and only the `replay`
command, `wb.replay` and the replay view reach them.
"""
