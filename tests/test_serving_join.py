"""Requests joined to engine steps on a hand-built case, every figure computed by hand (the rules are in
`workbench.serving.join`'s docstring), and the findings that read the join."""

from __future__ import annotations

import pyarrow as pa
import pytest

from workbench.serving.findings import serving_findings
from workbench.serving.join import with_phases
from workbench.serving.requests import REQUESTS_SCHEMA
from workbench.serving.steps import STEPS_SCHEMA
from workbench.serving.summary import phase_split


def steps_table(rows: list[tuple[int, int, str, int, int]]) -> pa.Table:
    """(start, dur, mode, prefill requests, decode requests) per step."""
    columns = {name: [None] * len(rows) for name in STEPS_SCHEMA.names}
    columns.update(step=list(range(len(rows))), start_ns=[r[0] for r in rows], dur_ns=[r[1] for r in rows],
                   mode=[r[2] for r in rows], prefill_requests=[r[3] for r in rows],
                   decode_requests=[r[4] for r in rows], engine=["vllm"] * len(rows))
    return pa.table(columns, schema=STEPS_SCHEMA)


def requests_table(rows: list[tuple[int, int | None, int]]) -> pa.Table:
    """(arrival, first token, end) per request."""
    columns = {name: [None] * len(rows) for name in REQUESTS_SCHEMA.names}
    columns.update(request=list(range(len(rows))), arrival_ns=[r[0] for r in rows],
                   first_token_ns=[r[1] for r in rows], end_ns=[r[2] for r in rows],
                   ttft_ns=[None if r[1] is None else r[1] - r[0] for r in rows], e2e_ns=[r[2] - r[0] for r in rows],
                   status=["ok"] * len(rows), source=["aiperf"] * len(rows))
    return pa.table(columns, schema=REQUESTS_SCHEMA)


STEPS = steps_table([
    (100, 50, "prefill", 2, 0),  # s0: A's and B's prompts
    (160, 10, "decode", 0, 2),  # s1
    (175, 30, "mixed", 1, 2),  # s2: C's prompt beside A's and B's decodes
    (210, 10, "decode", 0, 3),  # s3
    (225, 12, "decode", 0, 3),  # s4
    (310, 40, "prefill", 1, 0),  # s5: ends after D's first token reached the client: not D's
])
REQUESTS = requests_table([(90, 155, 230), (95, 158, 240), (120, 207, 260), (300, 340, 400), (500, None, 510)])


def test_requests_take_the_prefill_slots_first_come_first_served():
    joined = with_phases(REQUESTS, STEPS).to_pylist()
    columns = ("first_step", "last_step", "steps", "queued_ns", "prefill_ns", "delivery_ns", "decode_ns", "stalled_ns")
    got = [tuple(row[c] for c in columns) for row in joined]
    # The decode-only median is 10 ns: the mixed s2 stalled the decodes beside it by 30 - 10 = 20.
    assert got[0] == (0, 4, 5, 10, 50, 5, 75, 20)  # A: s0 (first slot), s2's stretch during its decode
    assert got[1] == (0, 4, 5, 5, 50, 8, 82, 20)  # B: s0's second slot
    assert got[2] == (2, 4, 5, 55, 30, 2, 53, 0)  # C: s0 started before it arrived; s2's slot
    assert got[3] == (None, 5, 1, None, None, None, None, None)  # D: no step could have made its first token
    assert got[4] == (None, None, 0, None, None, None, None, None)  # E: failed before any token, no step ran


def test_without_steps_every_join_column_is_null():
    joined = with_phases(REQUESTS, None)
    assert joined.num_rows == REQUESTS.num_rows
    assert all(joined[c].null_count == joined.num_rows for c in ("first_step", "queued_ns", "stalled_ns"))


def test_the_time_split_of_all_and_of_the_slowest_requests():
    split = phase_split(with_phases(REQUESTS, STEPS))
    assert split["all"] == pytest.approx({"queued": 10e-6, "prefill": 50e-6, "delivery": 5e-6, "decode": 75e-6,
                                          "stalled": 20e-6})  # medians of A, B, C (ms)
    assert split["slowest_ttft"]["queued"] == pytest.approx(55e-6)  # C: 87 ns to its first token, 55 queued


def test_queueing_and_interference_are_found_with_their_evidence():
    # The engine decodes others' requests until 100; three requests arriving at 10, 11, 12 wait for the mixed
    # steps at 100, 130, 160 (30 ns each, 3x the 10 ns decode-only steps).
    steps = steps_table([(10 * i, 10, "decode", 0, 3) for i in range(10)] +
                        [(100 + 30 * i, 30, "mixed", 1, 2) for i in range(3)])
    requests = requests_table([(10 + i, 131 + 30 * i, 400) for i in range(3)])
    found = {f.kind: f for f in serving_findings(with_phases(requests, steps), steps)}
    queueing = found["serving-queueing"]  # the slowest: queued 160 - 12 = 148 of its 179
    assert queueing.title == "p99 TTFT is queueing: 83% of it before the first prefill step"
    assert queueing.evidence["engine_busy_share"] == 1.0  # the engine ran steps the whole time it waited
    interference = found["serving-prefill-interference"]
    assert interference.title == "decode steps that share a batch with a prefill are 3.0× slower"
    assert interference.evidence["mixed_steps"] == 3 and interference.evidence["decode_steps"] == 10


def test_queueing_while_the_engine_idles_is_before_the_engine():
    # Three requests arrive 40 ns apart and each waits 90 ns, while the engine runs only a third of that time.
    steps = steps_table([(100 + 40 * i, 30, "mixed", 1, 2) for i in range(3)])
    requests = requests_table([(10 + 40 * i, 100 + 40 * i + 31, 400) for i in range(3)])
    (queueing,) = [f for f in serving_findings(with_phases(requests, steps), steps) if f.kind == "serving-queueing"]
    assert queueing.title == ("p99 TTFT is queueing before the engine: 74% of it before the first prefill step, "
                              "while the engine ran steps only 33% of that time")  # 270 of 363; 90 of 270


def test_delivery_is_found_when_the_token_reaches_the_client_late():
    steps = steps_table([(100, 10, "prefill", 1, 0)])
    requests = requests_table([(95, 200, 250)])  # computed by 110, seen at 200: 90 of 105 is delivery
    (finding,) = [f for f in serving_findings(with_phases(requests, steps), steps) if f.kind == "serving-delivery"]
    assert finding.title.startswith("p99 TTFT is delivery: 86% of it after the prefill step ended")
