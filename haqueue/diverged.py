"""`haqueue diverged`: list a broker's diverged files and send their messages to the primary (ha/quarantine.py,
design/replication.md "Divergence"). Runs beside the broker's data dir; needs nothing of the broker but its files."""
from __future__ import annotations

import json
from typing import Any

from proton import Message, ProtonException
from proton.utils import BlockingConnection, SendException

from .ha.quarantine import DONE_SUFFIX, diverged_files, file_format, file_queue, read_messages
from .plain_container import PlainContainer


def describe(data_dir: str) -> list[dict[str, Any]]:
    """Each diverged file not yet republished: its path, queue, message count and seq range."""
    out = []
    for path in diverged_files(data_dir):
        seqs = [seq for seq, _ in read_messages(path)]
        out.append({"file": str(path), "queue": file_queue(path), "messages": len(seqs),
                    "seqs": [min(seqs), max(seqs)] if seqs else []})
    return out


def republish(data_dir: str, address: str, user: str | None, password: str | None, timeout: float) -> list[dict[str, Any]]:
    """Send every diverged message to its queue at `address` (the primary), one at a time, each accepted before
    the next; a file whose messages were all accepted is renamed `*.republished`, so a second run sends nothing
    twice. Raises on the first refusal (what was sent of that file stays sent: those are duplicates at most), and
    before sending anything on a file of a newer format than this build reads (formats.NewerFormat)."""
    paths = diverged_files(data_dir)
    for path in paths:
        file_format(path)
    auth: dict[str, Any] = ({"sasl_enabled": False} if user is None else
                            {"allowed_mechs": "PLAIN", "user": user, "password": password or ""})
    done = []
    try:
        conn = BlockingConnection(f"amqp://{address}", timeout=timeout, container=PlainContainer(), **auth)
    except (ProtonException, OSError) as e:
        raise RuntimeError(f"cannot connect to {address}: {e}") from e
    try:
        for path in paths:
            queue = file_queue(path)
            sender = conn.create_sender(queue)
            count = 0
            for _, data in read_messages(path):
                message = Message()
                message.decode(data)
                try:
                    sender.send(message)
                except SendException as e:
                    raise RuntimeError(f"{path}: message {count + 1} refused by {address}: {e}") from e
                count += 1
            sender.close()
            path.rename(path.with_suffix(DONE_SUFFIX))
            done.append({"file": str(path), "queue": queue, "republished": count})
    finally:
        conn.close()
    return done


def print_lines(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(json.dumps(row))
