"""`haqueue` usage, config and connection errors: exit code 2 and a message on stderr; and `haqueue --version`.

No broker is needed: these stop before one would start or be reached.
"""
from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import free_port
from haqueue import __version__
from haqueue.cli import main
from haqueue.ha.protocol import OLDEST_PROTOCOL, PROTOCOL

REPO_ROOT = Path(__file__).resolve().parents[2]


def haqueue(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "haqueue", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    ([], "required: COMMAND"),
    (["bogus"], "invalid choice"),
    (["broker", "--bogus"], "unrecognized arguments: --bogus"),
    (["admin"], "required: COMMAND"),
    (["admin", "queue"], "required: COMMAND"),
    (["admin", "queue", "add"], "required: name"),
    (["admin", "queue", "add", "q", "--arg", "novalue"], "expected KEY=VALUE"),
    (["admin", "exchange", "add", "e"], "required: --type"),
    (["admin", "exchange", "add", "e", "--type", "headers"], "invalid choice: 'headers'"),
    (["admin", "bind", "e"], "required: queue"),
    (["admin", "-b", "localhost", "status"], "must be HOST:PORT"),
    (["admin", "--timeout", "soon", "status"], "invalid float value"),
    (["broker", "--node", "n1"], "--node and --shard go together, with --config of a sharded cluster"),
    (["broker", "--config", "c.yaml", "--shard", "1"], "--node and --shard go together"),
    (["cluster", "up", "--replicas", "2"], "--replicas goes with --shards"),
    (["cluster", "up", "--mirror-queues", "orders.*"], "--mirror-to and --mirror-queues go together"),
    (["cluster", "up", "--shards", "2", "--accept-mirror"], "a sharded cluster is not mirrored yet"),
])
def test_bad_usage(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["admin", "--help"]) == 0
    assert "queue" in capsys.readouterr().out


def test_version_names_the_release_and_the_replication_protocols(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == \
        f"haqueue {__version__} (replication protocol {PROTOCOL}; speaks {OLDEST_PROTOCOL}-{PROTOCOL})\n"


def test_bad_usage_subprocess() -> None:
    result = haqueue("admin", "queue", "frobnicate")
    assert result.returncode == 2
    assert "invalid choice: 'frobnicate'" in result.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    result = haqueue("broker", "--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory" in result.stderr


def test_config_with_bad_key(tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("lisen: ['127.0.0.1:5672']\n")
    result = haqueue("broker", "--config", str(config))
    assert result.returncode == 2
    assert f"{config}: lisen: unknown key (known: name, listen," in result.stderr


def test_config_with_bad_value(tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("limits: {max_depth: -1}\n")
    result = haqueue("broker", "--config", str(config))
    assert result.returncode == 2
    assert f"{config}: limits.max_depth: must be a non-negative integer, got -1" in result.stderr


def test_bad_listen_option() -> None:
    result = haqueue("broker", "--listen", "127.0.0.1")
    assert result.returncode == 2
    assert 'command line: --listen: must be HOST:PORT with a port 1..65535, got "127.0.0.1"' in result.stderr


def test_config_and_listen_together(tmp_path: Path) -> None:
    result = haqueue("broker", "--config", str(tmp_path / "x.yaml"), "--listen", "127.0.0.1:5672")
    assert result.returncode == 2
    assert "--config cannot be combined with --listen" in result.stderr


def test_admin_connection_refused() -> None:
    port = free_port()  # nothing listens there any more
    result = haqueue("admin", "-b", f"127.0.0.1:{port}", "--timeout", "5", "status")
    assert result.returncode == 2
    assert f"cannot connect to 127.0.0.1:{port}" in result.stderr
    assert result.stdout == ""


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections (the kernel does) but never says a word of AMQP."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_admin_timeout(silent_server: int) -> None:
    result = haqueue("admin", "-b", f"127.0.0.1:{silent_server}", "--timeout", "0.5", "queue", "list")
    assert result.returncode == 2
    assert "timed out" in result.stderr


@pytest.mark.parametrize("args, text, message", [
    ((), "listen: ['127.0.0.1:5672']", "listen: not in cluster up's config: use --base-port"),
    ((), "ha: {public: '127.0.0.1:5672'}", "ha.public: not in cluster up's config: use --public"),
    ((), "ha: {password: secret}", "ha.password: not in cluster up's config: cluster up makes the HA peer user"),
    ((), "http: {listen: '127.0.0.1:8000'}", "http.listen: not in cluster up's config: use --console-port"),
    ((), "limits: {max_dept: 5}", "limits.max_dept: unknown key (known: max_connections,"),
    ((), "users: {ha: pw}", "users.ha: is also ha.username, the HA peer user"),
    (("--sync", "quorum_mem"), "ha: {sync: all_disk}",
     "ha.sync: is 'all_disk' here, but --sync quorum_mem sets 'quorum_mem'"),
    (("--console-port", "0"), "http: {allow_origins: ['https://ops.example']}",
     "http: cluster up serves no console with --console-port 0"),
    (("--shards", "2"), "replicas: 2", "replicas: not in cluster up's config: use --replicas"),
    (("--shards", "2"), "anonymous: maybe", 'anonymous: must be true, false or a map {allow: {...}}, got "maybe"'),
])
def test_cluster_up_config_refused_naming_the_key(args: tuple[str, ...], text: str, message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """cluster up --config: a key cluster up sets itself, one an option sets otherwise, or one the brokers would
    refuse stops it at once, before it writes or starts anything."""
    config = tmp_path / "local.yaml"
    config.write_text(text + "\n")
    directory = tmp_path / "cluster"
    assert main(["cluster", "up", "--dir", str(directory), "--config", str(config), *args]) == 2
    assert f"haqueue: {config}: {message}" in capsys.readouterr().err
    assert not directory.exists()


def test_cluster_up_mirror_options_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The mirror's options need the mirror user's password in $HAQUEUE_MIRROR_PASSWORD; a --config whose mirror
    section says otherwise than they do is refused naming the key; neither writes or starts anything."""
    directory = tmp_path / "cluster"
    monkeypatch.delenv("HAQUEUE_MIRROR_PASSWORD", raising=False)
    assert main(["cluster", "up", "--dir", str(directory), "--accept-mirror"]) == 2
    assert "haqueue: --accept-mirror: set $HAQUEUE_MIRROR_PASSWORD to the password" in capsys.readouterr().err
    monkeypatch.setenv("HAQUEUE_MIRROR_PASSWORD", "mirror-secret")
    config = tmp_path / "local.yaml"
    config.write_text("mirror: {queues: [billing]}\n")
    assert main(["cluster", "up", "--dir", str(directory), "--config", str(config), "--mirror-to", "127.0.0.1:5682",
                 "--mirror-queues", "orders.*"]) == 2
    assert (f"haqueue: {config}: mirror.queues: is ['billing'] here, but --mirror-to 127.0.0.1:5682 sets "
            f"['orders.*']") in capsys.readouterr().err
    assert not directory.exists()
