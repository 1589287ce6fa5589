"""The notebook shipped with the package runs headless (nbclient) on a small event set and shows
the same figures as the command, and its live section runs the job of `haqueue audit watch` in the kernel's Spark session."""
from __future__ import annotations

from pathlib import Path

import pytest

from eventsets import failover_scenario

import haqueue.audit

pytestmark = pytest.mark.slow

NOTEBOOK = Path(haqueue.audit.__file__).parent / "notebooks" / "replication-lag.ipynb"


def test_notebook_runs_on_a_small_event_set(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    events = failover_scenario().write(tmp_path / "events")
    monkeypatch.setenv("HAQUEUE_AUDIT_EVENTS", str(events))
    monkeypatch.setenv("HAQUEUE_AUDIT_MASTER", "local[2]")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "77 events, 0 bad lines" in text
    assert "LOSS: 1 confirmed message missing on a ready backup" in text
    # The live section: the streaming job, once over the same events, finds the same missing message.
    assert "2027-01-15 08:00:00.000–2027-01-15 08:00:01.000 q b2: 10 live, lag ms p50 0.300" in text
    assert "MISSING q on b2: message msg-7 (seq 7)" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the lag distribution and the lag-over-time chart
    assert (tmp_path / "lag.png").exists()
