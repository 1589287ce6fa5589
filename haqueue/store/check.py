"""`haqueue store check DIR`: read a stopped broker's journal as recovery would, changing nothing. A journal newer
than this build reads is refused as the broker refuses it (formats.NewerFormat: the command line's exit code)."""
from __future__ import annotations

import json
import os
import sys

from .recovery import read_journal, segment_numbers
from .records import Corrupt

EXIT_OK, EXIT_CORRUPT, EXIT_USAGE = 0, 1, 2


def check(data_dir: str) -> int:
    directory = os.path.join(data_dir, "journal")
    if not segment_numbers(directory):
        print(f"haqueue: store check: no journal segments in {directory}", file=sys.stderr)
        return EXIT_USAGE
    try:
        image = read_journal(directory, repair=False)
    except Corrupt as e:
        print(f"haqueue: store check: {e}", file=sys.stderr)
        return EXIT_CORRUPT
    print(json.dumps({"directory": directory, "segments": len(image.segments), "bytes": sum(image.segments.values()),
                      "versions": sorted(set(image.versions.values())),
                      "records": image.records, "queues": {q.name: len(q.messages) for q in image.queues.values()},
                      "exchanges": sorted(image.exchanges), "bindings": len(image.bindings),
                      "messages": image.messages, "torn": image.torn}))
    return EXIT_OK
