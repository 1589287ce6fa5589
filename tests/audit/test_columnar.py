"""columnar.convert without Spark: an event file's lines as Parquet rows, its lines that are not events kept as
they were, in order, block by block (test_lag.py audits a converted set against its JSON lines)."""
from __future__ import annotations

import io
import json

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from eventsets import failover_scenario  # noqa: E402
from haqueue.audit import columnar, schema  # noqa: E402


def test_events_become_rows_and_other_lines_are_kept_as_text_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(columnar, "BLOCK", 300)  # a few lines a block: blocks end mid-line, bad lines amid good
    monkeypatch.setattr(columnar, "ROW_GROUP", 4)
    log = failover_scenario().write(tmp_path / "events") / "b2-000004.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    odd = ["null", '{"t": "seven"}', "not json", '{"t":1}{"t":2}', "[1]"]
    lines = [json.dumps(e, separators=(",", ":")) for e in events]
    text = "\n".join(lines[:5] + odd[:2] + lines[5:9] + ["", "   "] + odd[2:] + lines[9:]) + "\r\n" + lines[0][:30]
    out = io.BytesIO()
    counts = columnar.convert(io.BytesIO(text.encode()), out)
    assert counts == columnar.Counts(rows=len(lines), kept=len(odd) + 1)
    parquet = pq.ParquetFile(io.BytesIO(out.getvalue()))
    assert parquet.schema_arrow == columnar.SCHEMA and parquet.metadata.num_row_groups > 1
    rows = parquet.read().to_pylist()
    kept = [row[schema.CORRUPT] for row in rows if row[schema.CORRUPT] is not None]
    assert kept == [*odd, lines[0][:30]]  # the torn last line too
    assert [{k: v for k, v in row.items() if v is not None} for row in rows if row[schema.CORRUPT] is None] == events
    assert [row[schema.CORRUPT] for row in rows].index("null") == 5  # in the file's order
