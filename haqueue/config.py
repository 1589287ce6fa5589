"""The broker's YAML config as dataclasses; every error names the file, the key and the reason.

The schema is documented in design/management.md.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import yaml

from .passwords import BadHash, check_hash

DEFAULT_LISTEN = "127.0.0.1:5672"
EXCHANGE_TYPES = ("direct", "topic", "fanout")
SASL_MODES = ("optional", "required")
OVERFLOW_POLICIES = ("block", "reject-publish", "drop-head")  # what a queue does with a publish over a limit
SYNC_MODES = ("all", "all_disk", "quorum_mem", "quorum_disk")  # ha.sync: when a publish is confirmed
# ha.replicate and x-replicate: what of an object is replicated (haqueue/ha/policy.py)
REPLICATE_LEVELS = ("none", "configuration", "durable", "all")
MEMORY_SHARE = 0.4  # the default memory_limit: this share of the machine's RAM
ANONYMOUS_USER = "anonymous"  # who a client without SASL, or with SASL ANONYMOUS, is


def default_memory_limit() -> int:
    """MEMORY_SHARE of the machine's physical memory, in bytes."""
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * MEMORY_SHARE)


class ConfigError(Exception):
    """A config file or command line that cannot be used; the message names file, key and reason."""


@dataclass
class ListenerConfig:
    host: str
    port: int
    max_frame_size: int = 65536
    sasl: str = "optional"  # "optional": anonymous and no-SASL clients allowed (if `anonymous`); "required"
    tls: bool = False
    require_client_cert: bool = False  # TLS clients must present a certificate from tls.ca_file (SASL EXTERNAL)
    reuse_port: bool = False  # SO_REUSEPORT: several processes (a node's shards) share the address


@dataclass
class TlsConfig:
    cert_file: str
    key_file: str
    ca_file: str | None = None


@dataclass
class LimitsConfig:
    # 0: as many client connections as the file descriptors allow (RabbitMQ and Artemis set no limit either).
    # HA's peers count against no client limit, these three included (design/security.md).
    max_connections: int = 0
    max_links_per_connection: int = 1000
    max_sessions_per_connection: int = 64
    max_depth: int = 0  # 0: unbounded; default for queues
    max_bytes: int = 0  # 0: unbounded; default for queues
    overflow: str = "block"  # default for queues: block | reject-publish | drop-head
    memory_limit: int = field(default_factory=default_memory_limit)  # bytes in all queues; 0: none
    max_frame_size: int = 65536
    max_message_size: int = 0  # 0: unbounded
    idle_timeout: float = 60.0  # seconds; 0 disables heartbeats
    output_buffer: int = 4 * 1024 * 1024
    # What one hostile client can hold (design/security.md).
    handshake_timeout: float = 10.0  # seconds from the client's first byte to its AMQP open (TLS, SASL included)
    max_connections_per_user: int = 0  # 0: no limit; anonymous clients are limited per address only
    max_connections_per_address: int = 0  # 0: no limit; every connection from the address counts


@dataclass
class QueueConfig:
    name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExchangeConfig:
    name: str
    type: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class BindingConfig:
    exchange: str
    queue: str
    key: str = ""
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class ZooKeeperConfig:
    """`ha.zookeeper`: the ensemble the brokers elect their primary through (design/zookeeper.md)."""

    hosts: list[tuple[str, int]]
    path: str = "/haqueue"  # the cluster's znode; one per cluster
    session_timeout: float = 4.0  # seconds; a primary that cannot renew its lease within it stops serving
    weight: int = 0  # breaks ties between equally up-to-date candidates: the higher wins
    preferred: bool = False  # this broker is its group's preferred primary: ranked first when ready, resigned to
    failback_delay: float = 30.0  # seconds the preferred member is ready before a primary resigns to it; 0: never


@dataclass
class HaConfig:
    """The `ha:` section: this broker is one of a hot-standby cluster."""

    brokers: list[tuple[str, int]]  # every broker's real address, this one included
    username: str
    password: str
    public: tuple[str, int] | None = None  # the clients' address, bound only while primary
    replicate: str = "all"  # default x-replicate: none | configuration | durable | all
    sync: str = "all"  # when a publish is confirmed: all | all_disk | quorum_mem | quorum_disk (design/store.md)
    backup_timeout: float = 5.0  # seconds a backup may take to confirm before it is dropped
    # Brokers, the primary counted, that hold a message before it is confirmed, whatever the sync mode; 0: a
    # majority of `brokers`. 1 lets a primary cut off from its backups confirm alone: it may lose data under a
    # network partition (design/replication.md).
    min_confirmations: int = 0
    # How a backup closes a client's connection: amqp:connection:forced (false), which the reconnect of proton
    # Python, proton C++ and rhea take as "try the next address", or amqp:connection:redirect (true), which ends
    # theirs and only redirect-aware clients follow. Both carry the primary's client address in their info.
    client_redirect: bool = False
    # After a total outage, how long coordinators wait for every broker before promoting the freshest of
    # those that answered (a staler store than one still on its way loses what only that one has).
    recovery_wait: float = 10.0
    coordinator: str = "external"  # who promotes: external (admin, supervisor, Pacemaker) | zookeeper
    zookeeper: ZooKeeperConfig | None = None
    tls: TlsConfig | None = None  # peers talk TLS on the listener in `brokers`, certificates from tls.ca_file


@dataclass
class MirrorConfig:
    """The `mirror:` section (design/mirroring.md): this cluster's primary mirrors the queues matching `queues` to
    a standby cluster at `to`, logging in there as `username`; and/or, as a standby, lets the users in
    `accept_from` mirror into it."""

    cluster: str = ""  # this cluster's name, the same on every broker of it: a standby keeps each source apart by it
    to: list[tuple[str, int]] = field(default_factory=list)  # the standby's client address(es), tried in turn
    username: str = ""
    password: str = ""
    tls: TlsConfig | None = None  # TLS to the standby: our certificate, and its CA
    queues: list[str] = field(default_factory=list)  # globs of the queues mirrored; none by default
    max_backlog_bytes: int = 0  # message data per queue the standby has not confirmed before the mirror says so; 0: none
    accept_from: list[str] = field(default_factory=list)  # users of this cluster who may mirror into it


@dataclass
class AuditConfig:
    """The `audit:` section: write replication events as JSON lines (design/audit-events.md)."""

    dir: str
    max_bytes: int = 64 * 1024 * 1024  # a file is closed and the next one started past this size
    rotate_seconds: float = 300.0  # ... or once it has been open this long (`audit ship` copies closed files)


@dataclass
class StoreConfig:
    """The `store:` section: the journal of durable wiring and messages in data_dir (design/store.md)."""

    enabled: bool = True
    segment_bytes: int = 64 * 1024 * 1024  # a segment is closed and the next started past this size
    compact_ratio: float = 2.0  # the journal is compacted when larger than this times the live data
    page_above: int = 0  # bytes of durable bodies in memory above which queues page; 0: an eighth of the RAM


@dataclass
class MetricsConfig:
    """The `metrics:` section: serve Prometheus metrics over HTTP at /metrics (design/metrics.md)."""

    listen: tuple[str, int]


@dataclass
class HttpConfig:
    """The `http:` section: the web console and its JSON API (design/console.md)."""

    listen: tuple[str, int]
    tls: TlsConfig | None = None  # served over HTTPS with this certificate
    # Origins (scheme://host:port) of pages allowed to call this console's API besides those of the cluster's own
    # hosts (ha.brokers, ha.public): a console reached by a host name the cluster's addresses do not use.
    allow_origins: list[str] = field(default_factory=list)


@dataclass
class AllowConfig:
    """What a user may do (design/permissions.md): address globs per action, and the admin operations."""

    send: list[str] = field(default_factory=list)
    receive: list[str] = field(default_factory=list)  # receiving includes browsing
    manage: list[str] = field(default_factory=list)  # declare and delete queues, exchanges, bindings
    admin: bool = False  # the ha, store and status operations, and reading every object's attributes


def allow_everything() -> AllowConfig:
    """A plain-password user's, and the anonymous client's with `anonymous: true`."""
    return AllowConfig(["*"], ["*"], ["*"], True)


@dataclass
class UserConfig:
    """One `users:` entry: exactly one of password and password_hash (passwords.py)."""

    allow: AllowConfig
    password: str | None = None
    password_hash: str | None = None


@dataclass
class ShardConfig:
    """What a shard process of a cluster knows of the sharding (derived by shard/cluster_config.py)."""

    index: int  # this process's shard
    shards: int  # K
    publics: list[tuple[str, int]]  # each shard's direct address, bound only by its primary (the relay's target)
    client: tuple[str, int]  # the node's client address, shared by its shard processes
    # each shard's replicas in placement order, its preferred primary first: (node, peer listener address)
    replicas: list[list[tuple[str, tuple[str, int]]]] = field(default_factory=list)
    redirect: bool = False  # a link to another shard's queue is refused with amqp:link:redirect, not relayed
    assignment: dict[str, Any] = field(default_factory=dict)  # the placement as `haqueue place` prints it (JSON)
    zookeeper_path: str | None = None  # under ZooKeeper: the cluster's path, which holds the stored assignment
    # seconds the relay looks for a shard's primary before detaching its relayed links (shard.relay_timeout)
    relay_timeout: float = 60.0


@dataclass
class BrokerConfig:
    name: str
    listen: list[ListenerConfig]
    data_dir: str = "./data"
    auto_create: list[str] = field(default_factory=lambda: ["*"])
    queues: list[QueueConfig] = field(default_factory=list)
    exchanges: list[ExchangeConfig] = field(default_factory=list)
    bindings: list[BindingConfig] = field(default_factory=list)
    users: dict[str, UserConfig] = field(default_factory=dict)
    anonymous: AllowConfig | None = field(default_factory=allow_everything)  # None: anonymous clients refused
    tls: TlsConfig | None = None
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    ha: HaConfig | None = None
    audit: AuditConfig | None = None
    store: StoreConfig = field(default_factory=StoreConfig)
    metrics: MetricsConfig | None = None  # None: no metrics endpoint
    http: HttpConfig | None = None  # None: no web console
    shard: ShardConfig | None = None  # set for one shard's process of a sharded cluster
    mirror: MirrorConfig | None = None  # None: no mirroring, in either role


def parse_address(text: str) -> tuple[str, int]:
    """Split "HOST:PORT" (or "[IPv6]:PORT") into host and port; ValueError names what is wrong."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # sockets want the bare IPv6 address
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT with a port 1..65535, got {_show(text)}")
    return host, int(port)


# The sync modes under which every ready backup holds every confirmed message, so that a preferred primary
# may be ranked first among them (ha.zookeeper.preferred, design/zookeeper.md).
PREFERRED_SYNC_MODES = ("all", "all_disk")
CLUSTER_KEY = "shards"  # a file with it is a sharded cluster's (shard/cluster_config.py)


def read_yaml(path: str) -> Any:
    """A config file's YAML, read; an empty file is an empty map."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(e).split())}") from e
    return {} if raw is None else raw


def load_config(path: str) -> BrokerConfig:
    """Read and check a YAML config file; an empty file gives the defaults."""
    raw = read_yaml(path)
    if isinstance(raw, dict) and CLUSTER_KEY in raw:
        raise ConfigError(f"{path}: {CLUSTER_KEY}: a sharded cluster's config: run one shard's process of it "
                          f"with --node NODE --shard I")
    return broker_config(raw, path)


def broker_config(raw: Any, origin: str) -> BrokerConfig:
    """Check a broker config read from `origin` (a file, or the cluster file it was derived from)."""
    try:
        return _broker(raw)
    except _Bad as e:
        raise ConfigError(f"{origin}: {e.path}: {e.reason}") from e


def config_from_args(listen: list[str], name: str | None, data_dir: str | None) -> BrokerConfig:
    """The config for `haqueue broker --listen ... [--name] [--data-dir]`; no listener means the default."""
    raw: dict[str, Any] = {"listen": listen or [DEFAULT_LISTEN]}
    if name is not None:
        raw["name"] = name
    if data_dir is not None:
        raw["data_dir"] = data_dir
    try:
        return _broker(raw)
    except _Bad as e:
        option = "--" + e.path.partition("[")[0].replace("_", "-")  # listen[1] -> --listen
        raise ConfigError(f"command line: {option}: {e.reason}") from e


# ---- checking -------------------------------------------------------------------------------
# Each check takes (value, key path) and returns the value to store, or raises _Bad; the
# public functions add the file name, so every message reads "FILE: key.path: reason".

class _Bad(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


Check = Callable[[Any, str], Any]


def _show(value: Any) -> str:
    """A value as the user wrote it in YAML, short."""
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value, default=str)


def _expect(ok: bool, path: str, what: str, value: Any) -> None:
    if not ok:
        raise _Bad(path, f"must be {what}, got {_show(value)}")


def _string(value: Any, path: str) -> str:
    _expect(isinstance(value, str), path, "a string", value)
    return value


def _name(value: Any, path: str) -> str:
    _expect(isinstance(value, str) and value != "", path, "a non-empty string", value)
    return value


def _secret(value: Any, path: str) -> str:
    """A password: never shown in an error, which goes to the log."""
    if not isinstance(value, str) or value == "":
        raise _Bad(path, "must be a non-empty string (the value is not shown: it is a password)")
    return value


def _bool(value: Any, path: str) -> bool:
    _expect(isinstance(value, bool), path, "true or false", value)
    return value


def _int(low: int) -> Check:
    what = "a non-negative integer" if low == 0 else f"an integer >= {low}"

    def check(value: Any, path: str) -> int:
        # bool is an int in Python, but `max_depth: true` is a mistake
        _expect(isinstance(value, int) and not isinstance(value, bool) and value >= low, path, what, value)
        return value
    return check


def _seconds(value: Any, path: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    _expect(ok, path, "a non-negative number of seconds", value)
    return float(value)


def _choice(*options: str) -> Check:
    def check(value: Any, path: str) -> str:
        _expect(isinstance(value, str) and value in options, path, " or ".join(options), value)
        return value
    return check


def _address(value: Any, path: str) -> tuple[str, int]:
    _expect(isinstance(value, str), path, "a string HOST:PORT", value)
    try:
        return parse_address(value)
    except ValueError as e:
        raise _Bad(path, str(e)) from None


def _list_of(item: Check) -> Check:
    def check(value: Any, path: str) -> list[Any]:
        _expect(isinstance(value, list), path, "a list", value)
        return [item(x, f"{path}[{i}]") for i, x in enumerate(value)]
    return check


def _map_of(item: Check) -> Check:
    def check(value: Any, path: str) -> dict[str, Any]:
        _expect(isinstance(value, dict), path, "a map", value)
        for key in value:
            if not isinstance(key, str) or key == "":
                raise _Bad(path, f"keys must be non-empty strings, got {_show(key)}")
        return {k: item(x, f"{path}.{k}") for k, x in value.items()}
    return check


def _fields(value: Any, path: str, table: dict[str, Check], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check a map against a table of known keys; returns the checked values of the keys present."""
    _expect(isinstance(value, dict), path, "a map", value)
    prefix = f"{path}." if path else ""
    for key in value:
        if key not in table:
            raise _Bad(f"{prefix}{key}", f"unknown key (known: {', '.join(table)})")
    for key in required:
        if key not in value:
            raise _Bad(f"{prefix}{key}", "missing")
    return {key: table[key](x, f"{prefix}{key}") for key, x in value.items()}


def _record(cls: type, table: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    return lambda value, path: cls(**_fields(value, path, table, required))


_ARGS = _map_of(lambda value, path: value)  # queue/exchange arguments are the broker's to judge

_LISTENER: dict[str, Check] = {
    "address": _address,
    "max_frame_size": _int(512),  # AMQP's minimum max-frame-size
    "sasl": _choice(*SASL_MODES),
    "tls": _bool,
    "require_client_cert": _bool,
    "reuse_port": _bool,
}


def _listener(value: Any, path: str) -> dict[str, Any]:
    """A listen item as ListenerConfig arguments; max_frame_size is left out unless given,
    because its default comes from limits, which may be checked later."""
    if isinstance(value, str):
        fields: dict[str, Any] = {"address": _address(value, path)}
    else:
        _expect(isinstance(value, dict), path, '"HOST:PORT" or a map', value)
        fields = _fields(value, path, _LISTENER, required=("address",))
    fields["host"], fields["port"] = fields.pop("address")
    return fields


def _tls(value: Any, path: str, required: tuple[str, ...]) -> TlsConfig:
    return TlsConfig(**_fields(value, path, {"cert_file": _name, "key_file": _name, "ca_file": _name}, required))


_LIMITS: dict[str, Check] = {
    "max_connections": _int(0),
    "max_links_per_connection": _int(1),
    "max_sessions_per_connection": _int(1),
    "max_depth": _int(0),
    "max_bytes": _int(0),
    "overflow": _choice(*OVERFLOW_POLICIES),
    "memory_limit": _int(0),
    "max_frame_size": _int(512),
    "max_message_size": _int(0),
    "idle_timeout": _seconds,
    "output_buffer": _int(1),
    "handshake_timeout": lambda value, path: _positive_seconds(value, path),  # defined below
    "max_connections_per_user": _int(0),
    "max_connections_per_address": _int(0),
}


def _zk_hosts(value: Any, path: str) -> list[tuple[str, int]]:
    """A list of HOST:PORT, or one string "HOST:PORT,HOST:PORT" as ZooKeeper clients write it."""
    items = value.split(",") if isinstance(value, str) else value
    hosts = _list_of(_address)(items, path)
    if not hosts:
        raise _Bad(path, "must name at least one ZooKeeper server")
    return hosts


def _zk_path(value: Any, path: str) -> str:
    _expect(isinstance(value, str), path, "a string", value)
    parts = value.split("/")[1:]
    ok = value.startswith("/") and all(p not in ("", ".", "..") for p in parts) and parts[0] != "zookeeper"
    if not ok or any(c in value for c in "\0\n"):
        raise _Bad(path, f"must be an absolute ZooKeeper path like /haqueue/cluster1 (not / nor under "
                         f"/zookeeper, no empty, . or .. parts), got {_show(value)}")
    return value


def _positive_seconds(value: Any, path: str) -> float:
    seconds = _seconds(value, path)
    _expect(seconds > 0, path, "a positive number of seconds", value)
    return seconds


def _ratio(value: Any, path: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 1.2
    _expect(ok, path, "a number >= 1.2", value)
    return float(value)


_ZOOKEEPER: dict[str, Check] = {
    "hosts": _zk_hosts,
    "path": _zk_path,
    "session_timeout": _positive_seconds,
    "weight": _int(0),
    "preferred": _bool,
    "failback_delay": _seconds,
}

_HA: dict[str, Check] = {
    "brokers": _list_of(_address),
    "username": _name,
    "password": _secret,
    "public": _address,
    "replicate": _choice(*REPLICATE_LEVELS),
    "sync": _choice(*SYNC_MODES),
    "backup_timeout": _seconds,
    "min_confirmations": _int(1),
    "client_redirect": _bool,
    "recovery_wait": _seconds,
    "coordinator": _choice("external", "zookeeper"),
    "zookeeper": _record(ZooKeeperConfig, _ZOOKEEPER, ("hosts",)),
    "tls": lambda value, path: _tls(value, path, ("cert_file", "key_file", "ca_file")),
}


_ALLOW: dict[str, Check] = {
    "send": _list_of(_name),
    "receive": _list_of(_name),
    "manage": _list_of(_name),
    "admin": _bool,
}


def _allow(value: Any, path: str) -> AllowConfig:
    return AllowConfig(**_fields(value, path, _ALLOW))


def _password_hash(value: Any, path: str) -> str:
    _expect(isinstance(value, str), path, "a string made by `haqueue passwd`", value)
    try:
        check_hash(value)
    except BadHash as e:
        raise _Bad(path, str(e)) from None
    return value


_USER: dict[str, Check] = {"password": _secret, "password_hash": _password_hash, "allow": _allow}


def _user(value: Any, path: str) -> UserConfig:
    """A plain password (allowed everything, as before permissions existed), or a map."""
    if isinstance(value, str):
        return UserConfig(allow_everything(), password=_secret(value, path))
    if not isinstance(value, dict):
        raise _Bad(path, "must be a password string, or a map {password or password_hash, allow} "
                         "(the value is not shown: it may be a password)")
    fields = _fields(value, path, _USER)
    if "password" in fields and "password_hash" in fields:
        raise _Bad(path, "takes password or password_hash, not both (with neither, the user logs in only with "
                         "a client certificate: SASL EXTERNAL)")
    if "allow" not in fields:
        raise _Bad(f"{path}.allow", "missing (a user given as a map lists what it may do, e.g. "
                                    "{send: [\"orders.*\"]}; one given as a plain password may do everything)")
    return UserConfig(**fields)


def _users(value: Any, path: str) -> dict[str, UserConfig]:
    users = _map_of(_user)(value, path)
    if ANONYMOUS_USER in users:
        raise _Bad(f"{path}.{ANONYMOUS_USER}", "is reserved for clients without a user name: give what they "
                                               "may do under the top-level anonymous: {allow: ...}")
    return users


def _anonymous(value: Any, path: str) -> AllowConfig | None:
    """true: let anonymous clients in, allowed everything; false: refuse them; {allow: ...}: let them do that."""
    if isinstance(value, bool):
        return allow_everything() if value else None
    _expect(isinstance(value, dict), path, "true, false or a map {allow: {...}}", value)
    return _fields(value, path, {"allow": _allow}, ("allow",))["allow"]


def _ha(value: Any, path: str) -> HaConfig:
    fields = _fields(value, path, _HA, ("brokers", "username", "password"))
    zookeeper = fields.get("coordinator") == "zookeeper"
    if zookeeper and "zookeeper" not in fields:
        raise _Bad(f"{path}.zookeeper", "missing (ha.coordinator is zookeeper: give at least its hosts)")
    if not zookeeper and "zookeeper" in fields:
        raise _Bad(f"{path}.zookeeper", "given but ha.coordinator is not zookeeper")
    if zookeeper and fields["zookeeper"].preferred and fields.get("sync", "all") not in PREFERRED_SYNC_MODES:
        raise _Bad(f"{path}.zookeeper.preferred", f"needs ha.sync all or all_disk, got {fields['sync']}: under a "
                                                  f"quorum mode a ready backup may lack confirmed messages")
    wanted, brokers = fields.get("min_confirmations", 0), len(fields["brokers"])
    if wanted > brokers:
        raise _Bad(f"{path}.min_confirmations", f"is {wanted}, more than the {brokers} brokers of ha.brokers: "
                                                f"nothing could ever be confirmed")
    return HaConfig(**fields)


_MIRROR: dict[str, Check] = {
    "cluster": _name,
    "to": _list_of(_address),
    "username": _name,
    "password": _secret,
    "tls": lambda value, path: _tls(value, path, ("cert_file", "key_file", "ca_file")),
    "queues": _list_of(_name),
    "max_backlog_bytes": _int(0),
    "accept_from": _list_of(_name),
}


def _mirror(value: Any, path: str) -> MirrorConfig:
    """A source names the standby and how to log in there; a standby, who may mirror into it; a section may do both."""
    fields = _fields(value, path, _MIRROR)
    if fields.get("to"):
        for key in ("cluster", "username", "password"):
            if key not in fields:
                raise _Bad(f"{path}.{key}", "missing (mirror.to names a standby: give this cluster's name and the "
                                            "user this cluster logs in as there)")
    for key in ("queues", "username", "password", "tls", "max_backlog_bytes"):
        if key in fields and not fields.get("to"):
            raise _Bad(f"{path}.{key}", "given but mirror.to names no standby to mirror to")
    if not fields.get("to") and not fields.get("accept_from"):
        raise _Bad(path, "names no standby (to) and accepts no mirror (accept_from): give either")
    return MirrorConfig(**fields)


_TOP: dict[str, Check] = {
    "name": _name,
    "listen": _list_of(_listener),
    "data_dir": _name,
    "auto_create": _list_of(_name),
    "queues": _list_of(_record(QueueConfig, {"name": _name, "args": _ARGS}, ("name",))),
    "exchanges": _list_of(_record(ExchangeConfig, {"name": _name, "type": _choice(*EXCHANGE_TYPES), "args": _ARGS},
                                  ("name", "type"))),
    "bindings": _list_of(_record(BindingConfig, {"exchange": _name, "queue": _name, "key": _string, "args": _ARGS},
                                 ("exchange", "queue"))),
    "users": _users,
    "anonymous": _anonymous,
    "tls": lambda value, path: _tls(value, path, ("cert_file", "key_file")),
    "limits": _record(LimitsConfig, _LIMITS),
    "ha": _ha,
    "audit": _record(AuditConfig, {"dir": _name, "max_bytes": _int(4096), "rotate_seconds": _positive_seconds},
                     ("dir",)),
    "metrics": _record(MetricsConfig, {"listen": _address}, ("listen",)),
    "http": lambda value, path: _http(value, path),  # defined below
    "store": _record(StoreConfig, {"enabled": _bool, "segment_bytes": _int(4096), "compact_ratio": _ratio,
                                    "page_above": _int(0)}),
    "mirror": _mirror,
}


def _origin(value: Any, path: str) -> str:
    """scheme://host[:port], as a browser sends it in Origin."""
    ok = isinstance(value, str) and re.fullmatch(r"https?://[^/\s:]+(:[0-9]{1,5})?", value) is not None
    _expect(ok, path, 'an origin "http://HOST:PORT" or "https://HOST:PORT" (no path)', value)
    return value


def _http(value: Any, path: str) -> HttpConfig:
    fields = _fields(value, path, {"listen": _address, "tls": _record(TlsConfig, {"cert_file": _name, "key_file": _name},
                                                                      ("cert_file", "key_file")),
                                   "allow_origins": _list_of(_origin)}, ("listen",))
    return HttpConfig(**fields)


def _unique(items: Sequence[QueueConfig | ExchangeConfig], path: str) -> None:
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        if item.name in first:
            raise _Bad(f"{path}[{i}].name", f"duplicate name {_show(item.name)} (first at {path}[{first[item.name]}])")
        first[item.name] = i


def _peer_user(ha: HaConfig | None, users: dict[str, UserConfig]) -> None:
    """ha.username is a user of its own, whose permissions are fixed (design/permissions.md)."""
    if ha is None:
        return
    if ha.username == ANONYMOUS_USER:
        raise _Bad("ha.username", f'must not be "{ANONYMOUS_USER}", the name of clients without a user')
    if ha.username in users:
        raise _Bad(f"users.{ha.username}", "is also ha.username, the HA peer user: its password is ha.password "
                                           "and it may only open HA links and run admin operations; give the "
                                           "user of your clients another name")


def _mirror_users(mirror: MirrorConfig | None, users: dict[str, UserConfig]) -> None:
    """Who may mirror into this cluster logs in as a user of its own `users`."""
    for i, user in enumerate(mirror.accept_from if mirror is not None else ()):
        if user not in users:
            raise _Bad(f"mirror.accept_from[{i}]", f"names {_show(user)}, not one of this broker's users")


def _check_client_certs(listener: ListenerConfig, tls: TlsConfig | None, path: str) -> None:
    if listener.require_client_cert and not listener.tls:
        raise _Bad(f"{path}.require_client_cert", "is true but the listener's tls is not")
    if listener.require_client_cert and (tls is None or not tls.ca_file):
        raise _Bad(f"{path}.require_client_cert", "is true but there is no tls.ca_file to verify certificates with")


def _check_peer_tls(ha: HaConfig, listen: list[ListenerConfig]) -> None:
    """ha.tls secures the listener named in ha.brokers: it must exist, and not be a client TLS listener too."""
    if ha.tls is None:
        return
    peer = next((i for i, l in enumerate(listen) if (l.host, l.port) in ha.brokers), None)
    if peer is None:
        raise _Bad("ha.tls", "is set but no listen address is in ha.brokers (the peers' listener it secures)")
    if listen[peer].tls or listen[peer].require_client_cert:
        raise _Bad(f"listen[{peer}].tls", "the peers' listener (in ha.brokers) takes its TLS from ha.tls: "
                                          "remove tls and require_client_cert from it")


def _broker(raw: Any) -> BrokerConfig:
    if not isinstance(raw, dict):
        raise _Bad("top level", f"must be a map of the keys {', '.join(_TOP)}, got {_show(raw)}")
    fields = _fields(raw, "", _TOP)
    limits = fields.setdefault("limits", LimitsConfig())
    listen = fields.get("listen", [_listener(DEFAULT_LISTEN, "listen")])
    if not listen:
        raise _Bad("listen", "must name at least one address")
    fields["listen"] = [ListenerConfig(**{"max_frame_size": limits.max_frame_size, **item}) for item in listen]
    for i, listener in enumerate(fields["listen"]):
        if listener.tls and "tls" not in fields:
            raise _Bad(f"listen[{i}].tls", "is true but there is no top-level tls section (cert_file, key_file)")
        _check_client_certs(listener, fields.get("tls"), f"listen[{i}]")
    if "ha" in fields:
        _check_peer_tls(fields["ha"], fields["listen"])
    _peer_user(fields.get("ha"), fields.get("users", {}))
    _mirror_users(fields.get("mirror"), fields.get("users", {}))
    _unique(fields.get("queues", []), "queues")
    _unique(fields.get("exchanges", []), "exchanges")
    fields.setdefault("name", socket.gethostname())
    return BrokerConfig(**fields)
