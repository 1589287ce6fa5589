"""haqueue.config: good configs load; every bad one raises ConfigError naming file, key and reason."""
from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from haqueue.config import (AllowConfig, BindingConfig, ConfigError, ExchangeConfig, LimitsConfig, ListenerConfig,
                            QueueConfig, TlsConfig, UserConfig, allow_everything, config_from_args, load_config)
from haqueue.passwords import make_hash

REPO_ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "broker.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_full_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
        name: b1
        listen:
          - "127.0.0.1:5672"
          - {address: "0.0.0.0:5671", max_frame_size: 1024, sasl: required, tls: true}
          - "[::1]:5673"
        data_dir: /var/lib/haqueue
        auto_create: ["tmp.*", "q*"]
        queues:
          - name: q1
            args: {max_depth: 10, x-replicate: all, ttl: 5.0}
          - {name: q2}
        exchanges:
          - {name: e1, type: topic, args: {durable: true}}
        bindings:
          - {exchange: e1, queue: q1, key: "a.#"}
          - {exchange: undeclared, queue: also-undeclared}
        users: {alice: secret}
        anonymous: false
        tls: {cert_file: c.pem, key_file: k.pem, ca_file: ca.pem}
        limits: {max_depth: 100, max_frame_size: 4096, idle_timeout: 2.5, max_message_size: 0}
        """))
    assert config.name == "b1"
    assert config.listen == [
        ListenerConfig("127.0.0.1", 5672, max_frame_size=4096),  # from limits
        ListenerConfig("0.0.0.0", 5671, max_frame_size=1024, sasl="required", tls=True),
        ListenerConfig("::1", 5673, max_frame_size=4096),
    ]
    assert config.data_dir == "/var/lib/haqueue"
    assert config.auto_create == ["tmp.*", "q*"]
    assert config.queues == [QueueConfig("q1", {"max_depth": 10, "x-replicate": "all", "ttl": 5.0}), QueueConfig("q2")]
    assert config.exchanges == [ExchangeConfig("e1", "topic", {"durable": True})]
    assert config.bindings == [BindingConfig("e1", "q1", "a.#"), BindingConfig("undeclared", "also-undeclared")]
    assert config.users == {"alice": UserConfig(allow_everything(), password="secret")}
    assert config.anonymous is None
    assert config.tls == TlsConfig("c.pem", "k.pem", "ca.pem")
    assert config.limits == LimitsConfig(max_depth=100, max_frame_size=4096, idle_timeout=2.5)
    assert isinstance(config.limits.idle_timeout, float)


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""))
    assert config.name == socket.gethostname()
    assert config.listen == [ListenerConfig("127.0.0.1", 5672)]
    assert config.data_dir == "./data"
    assert config.auto_create == ["*"]
    assert (config.queues, config.exchanges, config.bindings, config.users) == ([], [], [], {})
    assert config.anonymous == allow_everything() and config.tls is None
    assert config.limits == LimitsConfig()


def test_packaged_example_loads() -> None:
    config = load_config(str(REPO_ROOT / "packaging" / "haqueue.yaml"))
    assert config.listen == [ListenerConfig("127.0.0.1", 5672)]
    assert config.anonymous is None  # shipped closed: clients log in


def test_users_and_their_permissions(tmp_path: Path) -> None:
    hashed = make_hash("p4")
    config = load_config(write(tmp_path, f"""
        anonymous: {{allow: {{receive: ["public.*"]}}}}
        users:
          ops: {{password: p1, allow: {{send: ["*"], receive: ["*"], manage: ["*"], admin: true}}}}
          app: {{password: p2, allow: {{send: ["orders.*"], receive: ["orders.*"]}}}}
          legacy: p3
          hashed: {{password_hash: "{hashed}", allow: {{}}}}
        """))
    assert config.users == {
        "ops": UserConfig(AllowConfig(["*"], ["*"], ["*"], True), password="p1"),
        "app": UserConfig(AllowConfig(["orders.*"], ["orders.*"]), password="p2"),
        "legacy": UserConfig(allow_everything(), password="p3"),
        "hashed": UserConfig(AllowConfig(), password_hash=hashed),
    }
    assert config.anonymous == AllowConfig(receive=["public.*"])


def test_config_from_args() -> None:
    config = config_from_args(["127.0.0.1:5672", "[::1]:5673"], "b2", "/tmp/d")
    assert config.listen == [ListenerConfig("127.0.0.1", 5672), ListenerConfig("::1", 5673)]
    assert (config.name, config.data_dir) == ("b2", "/tmp/d")
    defaults = config_from_args([], None, None)
    assert defaults.listen == [ListenerConfig("127.0.0.1", 5672)]
    assert defaults.name == socket.gethostname() and defaults.data_dir == "./data"


@pytest.mark.parametrize("listen, name, data_dir, expected", [
    (["localhost"], None, None, "command line: --listen: must be HOST:PORT"),
    (["127.0.0.1:70000"], None, None, "command line: --listen: must be HOST:PORT"),
    (["127.0.0.1:5672"], "", None, "command line: --name: must be a non-empty string"),
    (["127.0.0.1:5672"], None, "", "command line: --data-dir: must be a non-empty string"),
])
def test_bad_args(listen: list[str], name: str | None, data_dir: str | None, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        config_from_args(listen, name, data_dir)


HASH = make_hash("x")

# (YAML, the message after "FILE: "); the message must start with it.
BAD = [
    ("lisen: []", "lisen: unknown key (known: name, listen, data_dir,"),
    ("- a\n- b", "top level: must be a map"),
    ("name: 5", "name: must be a non-empty string, got 5"),
    ("listen: 127.0.0.1:5672", 'listen: must be a list, got "127.0.0.1:5672"'),
    ("listen: []", "listen: must name at least one address"),
    ("listen: [localhost]", 'listen[0]: must be HOST:PORT with a port 1..65535, got "localhost"'),
    ("listen: [':5672']", "listen[0]: must be HOST:PORT"),
    ("listen: ['h:0']", 'listen[0]: must be HOST:PORT with a port 1..65535, got "h:0"'),
    ("listen: ['h:65536']", "listen[0]: must be HOST:PORT"),
    ("listen: ['h:x']", "listen[0]: must be HOST:PORT"),
    ("listen: [5672]", 'listen[0]: must be "HOST:PORT" or a map, got 5672'),
    ("listen: [{max_frame_size: 1024}]", "listen[0].address: missing"),
    ("listen: [{address: 'h:1', port: 2}]",
     "listen[0].port: unknown key (known: address, max_frame_size, sasl, tls, require_client_cert, reuse_port)"),
    ("listen: ['h:1', {address: 'h:2', sasl: always}]", 'listen[1].sasl: must be optional or required, got "always"'),
    ("listen: [{address: 'h:1', max_frame_size: 100}]", "listen[0].max_frame_size: must be an integer >= 512, got 100"),
    ("listen: [{address: 'h:1', tls: yes please}]", 'listen[0].tls: must be true or false, got "yes please"'),
    ("listen: [{address: 'h:1', tls: true}]", "listen[0].tls: is true but there is no top-level tls section"),
    ("data_dir: ''", 'data_dir: must be a non-empty string, got ""'),
    ("auto_create: '*'", 'auto_create: must be a list, got "*"'),
    ("auto_create: ['a', 3]", "auto_create[1]: must be a non-empty string, got 3"),
    ("queues: [{args: {}}]", "queues[0].name: missing"),
    ("queues: [{name: q, durable: true}]", "queues[0].durable: unknown key (known: name, args)"),
    ("queues: [{name: q, args: [1]}]", "queues[0].args: must be a map, got a list"),
    ("queues: [{name: q, args: {1: x}}]", "queues[0].args: keys must be non-empty strings, got 1"),
    ("queues: [{name: q}, {name: r}, {name: q}]", 'queues[2].name: duplicate name "q" (first at queues[0])'),
    ("exchanges: [{name: e, type: headers}]", 'exchanges[0].type: must be direct or topic or fanout, got "headers"'),
    ("exchanges: [{name: e}]", "exchanges[0].type: missing"),
    ("exchanges: [{name: e, type: direct}, {name: e, type: topic}]", "exchanges[1].name: duplicate name"),
    ("bindings: [{exchange: e}]", "bindings[0].queue: missing"),
    ("bindings: [{exchange: e, queue: q, key: 5}]", "bindings[0].key: must be a string, got 5"),
    ("users: [alice]", "users: must be a map, got a list"),
    ("users: {alice: 1234}", "users.alice: must be a password string, or a map {password or password_hash, allow} "
                             "(the value is not shown"),
    ("users: {alice: ''}", "users.alice: must be a non-empty string (the value is not shown: it is a password)"),
    ("users: {app: {password: 5, allow: {}}}", "users.app.password: must be a non-empty string (the value is not"),
    ("users: {app: {password: p, allow: {sned: ['*']}}}",
     "users.app.allow.sned: unknown key (known: send, receive, manage, admin)"),
    ("users: {app: {password: p, alow: {}}}", "users.app.alow: unknown key (known: password, password_hash, allow)"),
    ("users: {app: {password: p}}", "users.app.allow: missing (a user given as a map lists what it may do"),
    (f"users: {{app: {{password: p, password_hash: '{HASH}', allow: {{}}}}}}",
     "users.app: takes password or password_hash, not both"),
    ("users: {app: {password_hash: 'plain', allow: {}}}",
     "users.app.password_hash: is not a hash made by `haqueue passwd`"),
    ("users: {app: {password_hash: '$scrypt$ln=30,r=8,p=1$c2FsdA$aGFzaGhhc2hoYXNoaGFzaA', allow: {}}}",
     "users.app.password_hash: needs more than 256 MiB to check"),
    ("users: {app: {password: p, allow: {send: 'orders.*'}}}", 'users.app.allow.send: must be a list, got "orders.*"'),
    ("users: {app: {password: p, allow: {send: ['']}}}", 'users.app.allow.send[0]: must be a non-empty string'),
    ("users: {app: {password: p, allow: {admin: 1}}}", "users.app.allow.admin: must be true or false, got 1"),
    ("users: {anonymous: p}", "users.anonymous: is reserved for clients without a user name"),
    ("ha: {brokers: ['h:1'], username: ha, password: p}\nusers: {ha: q}", "users.ha: is also ha.username"),
    ("ha: {brokers: ['h:1'], username: anonymous, password: p}", 'ha.username: must not be "anonymous"'),
    ("ha: {brokers: ['h:1'], username: ha, password: 5}", "ha.password: must be a non-empty string (the value is not"),
    ("ha: {brokers: ['h:1', 'h:2'], username: ha, password: p, min_confirmations: 0}",
     "ha.min_confirmations: must be an integer >= 1, got 0"),
    ("ha: {brokers: ['h:1', 'h:2'], username: ha, password: p, min_confirmations: 3}",
     "ha.min_confirmations: is 3, more than the 2 brokers of ha.brokers: nothing could ever be confirmed"),
    ("ha: {brokers: ['h:1'], username: ha, password: p, replicate: durible}",
     'ha.replicate: must be none or configuration or durable or all, got "durible"'),
    ("anonymous: 1", "anonymous: must be true, false or a map {allow: {...}}, got 1"),
    ("anonymous: {}", "anonymous.allow: missing"),
    ("anonymous: {allow: {recieve: []}}", "anonymous.allow.recieve: unknown key (known: send, receive, manage, admin)"),
    ("tls: {cert_file: c.pem}", "tls.key_file: missing"),
    ("tls: {cert_file: c.pem, key_file: k.pem, ca: x}", "tls.ca: unknown key (known: cert_file, key_file, ca_file)"),
    ("limits: {max_depth: -1}", "limits.max_depth: must be a non-negative integer, got -1"),
    ("limits: {max_depth: 1.5}", "limits.max_depth: must be a non-negative integer, got 1.5"),
    ("limits: {max_depth: true}", "limits.max_depth: must be a non-negative integer, got true"),
    ("limits: {max_connections: -1}", "limits.max_connections: must be a non-negative integer, got -1"),
    ("limits: {max_bytes: 1.5}", "limits.max_bytes: must be a non-negative integer, got 1.5"),
    ("limits: {memory_limit: -1}", "limits.memory_limit: must be a non-negative integer, got -1"),
    ("limits: {overflow: drop-tail}", 'limits.overflow: must be block or reject-publish or drop-head, got "drop-tail"'),
    ("limits: {max_message_size: '1M'}", 'limits.max_message_size: must be a non-negative integer, got "1M"'),
    ("limits: {idle_timeout: -1}", "limits.idle_timeout: must be a non-negative number of seconds, got -1"),
    ("limits: {idle_timeout: .inf}", "limits.idle_timeout: must be a non-negative number of seconds"),
    ("limits: {max_conections: 5}", "limits.max_conections: unknown key (known: max_connections,"),
    ("limits: 5", "limits: must be a map, got 5"),
    ("audit: {dir: d, rotate_seconds: 0}", "audit.rotate_seconds: must be a positive number of seconds, got 0"),
    ("http: {listen: 15672}", 'http.listen: must be a string HOST:PORT, got 15672'),
    ("http: {}", "http.listen: missing"),
    ("http: {listen: 'h:1', tls: {cert_file: c.pem, key_file: k.pem, ca_file: x}}",
     "http.tls.ca_file: unknown key (known: cert_file, key_file)"),
    ("http: {listen: 'h:1', allow_origins: ['console.example.com']}",
     'http.allow_origins[0]: must be an origin "http://HOST:PORT" or "https://HOST:PORT" (no path), got "console.example.com"'),
]


@pytest.mark.parametrize("text, expected", BAD, ids=[b[1].split(":")[0] for b in BAD])
def test_bad_config(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {expected}"), str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=f"^{path}: cannot read: No such file or directory$"):
        load_config(path)


def test_invalid_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "name: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: invalid YAML:") and "line 2" in str(info.value)


def test_security_keys(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
        listen:
          - "127.0.0.1:5672"
          - {address: "127.0.0.1:5671", tls: true, require_client_cert: true}
        tls: {cert_file: c.pem, key_file: k.pem, ca_file: ca.pem}
        limits: {handshake_timeout: 2.5, max_connections_per_user: 10, max_connections_per_address: 20}
        ha:
          brokers: ["127.0.0.1:5672", "127.0.0.1:5772"]
          username: ha
          password: pw
          tls: {cert_file: peer.pem, key_file: peer.key, ca_file: cluster-ca.pem}
        """))
    assert config.listen[1] == ListenerConfig("127.0.0.1", 5671, tls=True, require_client_cert=True)
    assert config.limits == LimitsConfig(handshake_timeout=2.5, max_connections_per_user=10,
                                         max_connections_per_address=20)
    assert config.ha is not None and config.ha.tls == TlsConfig("peer.pem", "peer.key", "cluster-ca.pem")
    defaults = LimitsConfig()
    assert (defaults.handshake_timeout, defaults.max_connections_per_user, defaults.max_connections_per_address) == \
        (10.0, 0, 0)


HA = "ha: {brokers: ['h:1', 'h:2'], username: ha, password: pw, tls: %s}\nlisten: [%s]"
BAD_SECURITY = [
    ("listen: [{address: 'h:1', require_client_cert: true}]",
     "listen[0].require_client_cert: is true but the listener's tls is not"),
    ("tls: {cert_file: c, key_file: k}\nlisten: [{address: 'h:1', tls: true, require_client_cert: true}]",
     "listen[0].require_client_cert: is true but there is no tls.ca_file to verify certificates with"),
    ("limits: {handshake_timeout: 0}", "limits.handshake_timeout: must be a positive number of seconds, got 0"),
    ("limits: {max_connections_per_user: -1}", "limits.max_connections_per_user: must be a non-negative integer"),
    ("limits: {max_connections_per_address: x}", 'limits.max_connections_per_address: must be a non-negative'),
    (HA % ("{cert_file: c, key_file: k}", "'h:1'"), "ha.tls.ca_file: missing"),
    (HA % ("{cert_file: c, key_file: k, ca_file: a}", "'h:3'"),
     "ha.tls: is set but no listen address is in ha.brokers"),
    ("tls: {cert_file: c, key_file: k}\n" + HA % ("{cert_file: c, key_file: k, ca_file: a}",
                                                   "{address: 'h:1', tls: true}"),
     "listen[0].tls: the peers' listener (in ha.brokers) takes its TLS from ha.tls"),
]


@pytest.mark.parametrize("text, expected", BAD_SECURITY, ids=[b[1].split(":")[0] for b in BAD_SECURITY])
def test_bad_security_config(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {expected}"), str(info.value)
