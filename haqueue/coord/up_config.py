"""`haqueue cluster up --config FILE`: a broker config, as `haqueue broker --config` takes it, whose sections (users,
anonymous, limits, store, queues, audit, http's tls, ha.sync...) every broker of the local cluster starts from.

What `cluster up` sets itself (each broker's name, addresses and data, the HA peers and the peer user) is refused,
naming the option to use instead; so is a key that an option (`--sync`, `--audit-dir`, `--tls`, the mirror's) sets
to another value. Each broker's whole config is then checked as the broker checks it (config.py), before any broker starts
(Supervisor.local, sharded_cluster_up), so a wrong key stops `cluster up` at once naming it. Relative paths in the
file are the brokers' to read from the working directory, as `haqueue broker --config` does.

The mirror's options (design/mirroring.md) wire two local clusters in two commands: `--accept-mirror` makes a
standby (its user `--mirror-user`, allowed nothing but mirroring, and `mirror.accept_from`), `--mirror-to
HOST:PORT --mirror-queues GLOB` a source (`mirror:` named after --dir's last part). Both take the user's password
from $HAQUEUE_MIRROR_PASSWORD, which keeps it off the command line; TLS to the standby goes in --config's mirror.tls.
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

from ..config import ConfigError, read_yaml

TLS_FILES = {"ca_file": "ca.pem", "cert_file": "cert.pem", "key_file": "key.pem"}  # cluster up --tls DIR
MIRROR_PASSWORD = "HAQUEUE_MIRROR_PASSWORD"  # the environment variable with the mirror user's password
NO_FILE = "cluster up"  # what errors name when there is no --config
_PEER_USER = "cluster up makes the HA peer user and its password (written in DIR/broker-0.yaml; DIR/cluster.yaml with " \
             "--shards), which the supervisor and the brokers log in with; give clients users of their own"
_COORDINATOR = "cluster up's supervisor promotes the brokers; under ZooKeeper run each one with `haqueue broker` " \
               "(design/zookeeper.md)"
_CONSOLE = "use --console-port (broker i's console on 127.0.0.1:PORT + i; with --shards, shard i's on its node's " \
           "address, PORT + i)"
# key -> how cluster up sets it; a sharded cluster file's own keys too, which --shards lays out
OWNED = {
    "name": "cluster up names the brokers (broker-i; n<k>.s<i> with --shards)",
    "listen": "use --base-port (broker i listens on 127.0.0.1:base-port + i) and --public (the clients' address)",
    "data_dir": "use --dir (each broker's data is under it)",
    "tls": "cluster up's client listeners are plain AMQP: for TLS between the brokers use --tls DIR, for the "
           "console's HTTPS http.tls",
    "metrics": "its brokers would all bind metrics.listen; cluster up serves no metrics",
    "ha.brokers": "use --size and --base-port",
    "ha.public": "use --public",
    "ha.username": _PEER_USER,
    "ha.password": _PEER_USER,
    "ha.coordinator": _COORDINATOR,
    "ha.zookeeper": _COORDINATOR,
    "http.listen": _CONSOLE,
    "http.port": _CONSOLE,
    "shards": "use --shards",
    "replicas": "use --replicas",
    "nodes": "use --size (nodes 127.0.0.1, 127.0.0.2, ...)",
    "client_port": "use --public (every node's client address on its port)",
    "peer_base": "use --base-port",
    "shard_public": "use --base-port (shard i's direct address 127.0.0.1:base-port + K + i)",
    "pacemaker": "cluster up runs and supervises the processes itself",
}


class MirrorOptions(NamedTuple):
    """cluster up's mirror options."""

    cluster: str  # this cluster's name, as a source: --dir's last part
    to: str | None  # --mirror-to HOST:PORT: the standby's public address
    queues: list[str]  # --mirror-queues GLOB...
    user: str  # --mirror-user: the standby's user the source logs in as
    accept: bool  # --accept-mirror: a standby


class _Setting(NamedTuple):
    key: str  # dotted: ha.sync
    value: Any
    option: str  # the command line's words that set it
    path: bool  # a file's path: the file's relative one is read from the working directory


def cluster_settings(path: str | None, audit_dir: str | None, sync: str | None, tls_dir: str | None,
                     console: bool, mirror: MirrorOptions | None = None) -> dict[str, Any]:
    """The config every broker of `cluster up` starts from: the file's at `path`, with what the options set merged
    in; `console`: cluster up serves consoles (--console-port is not 0). ConfigError names the file and the key."""
    origin = path or NO_FILE
    raw = _read(path) if path else {}
    if "http" in raw and not console:
        raise ConfigError(f"{origin}: http: cluster up serves no console with --console-port 0")
    for setting in _options(audit_dir, sync, tls_dir) + (_mirror_options(mirror) if mirror else []):
        _merge(raw, setting, origin)
    return raw


def broker_audit(extra: dict[str, Any], name: str) -> dict[str, Any]:
    """Broker `name`'s share of `extra`'s audit section (`--audit-dir`, or the file's): a directory of its own,
    audit.dir/NAME, as a broker on a machine of its own has, so that `audit ship --config` ships its files alone;
    the audit reads the event files under audit.dir at any depth. Nothing without an audit.dir to divide."""
    audit = extra.get("audit")
    if not isinstance(audit, dict) or not isinstance(audit.get("dir"), str):
        return {}  # none, or one the brokers' check refuses
    return {"audit": {**audit, "dir": os.path.join(audit["dir"], name)}}


def _read(path: str) -> dict[str, Any]:
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level: must be a map of a broker config's keys (design/management.md)")
    for key, how in OWNED.items():
        if _present(raw, key):
            raise ConfigError(f"{path}: {key}: not in cluster up's config: {how}")
    for section in ("ha", "http"):  # cluster up adds its own keys to these
        if not isinstance(raw.get(section, {}), dict):
            raise ConfigError(f"{path}: {section}: must be a map")
    return raw


def _present(raw: dict[str, Any], key: str) -> bool:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _options(audit_dir: str | None, sync: str | None, tls_dir: str | None) -> list[_Setting]:
    settings = []
    if audit_dir:
        settings.append(_Setting("audit.dir", os.path.abspath(audit_dir), f"--audit-dir {audit_dir}", True))
    if sync:
        settings.append(_Setting("ha.sync", sync, f"--sync {sync}", False))
    if tls_dir:
        files = {key: os.path.abspath(os.path.join(tls_dir, name)) for key, name in TLS_FILES.items()}
        missing = [file for file in files.values() if not os.path.isfile(file)]
        if missing:
            raise ConfigError(f"--tls {tls_dir}: no {', '.join(missing)}")
        settings += [_Setting(f"ha.tls.{key}", file, f"--tls {tls_dir}", True) for key, file in files.items()]
    return settings


def _mirror_options(mirror: MirrorOptions) -> list[_Setting]:
    if not (mirror.to or mirror.accept):
        return []
    option = f"--mirror-to {mirror.to}" if mirror.to else "--accept-mirror"
    password = os.environ.get(MIRROR_PASSWORD)
    if not password:
        raise ConfigError(f"{option}: set ${MIRROR_PASSWORD} to the password of the standby's user {mirror.user!r} "
                          f"(the same for the standby's cluster up --accept-mirror and the source's --mirror-to)")
    settings = []
    if mirror.accept:
        settings += [_Setting(f"users.{mirror.user}", {"password": password, "allow": {}}, "--accept-mirror", False),
                     _Setting("mirror.accept_from", [mirror.user], "--accept-mirror", False)]
    if mirror.to:
        settings += [_Setting(f"mirror.{key}", value, option, False) for key, value in (
            ("cluster", mirror.cluster), ("to", [mirror.to]), ("username", mirror.user), ("password", password),
            ("queues", mirror.queues))]
    return settings


def _merge(raw: dict[str, Any], setting: _Setting, origin: str) -> None:
    """Set the option's value in `raw`, unless the file gives that key another value."""
    *sections, leaf = setting.key.split(".")
    node = raw
    for section in sections:
        node = node.setdefault(section, {})
        if not isinstance(node, dict):
            return  # not a map: the brokers' check refuses it, naming it
    if leaf in node:
        given = node[leaf]
        same = os.path.abspath(given) if setting.path and isinstance(given, str) else given
        if same != setting.value:
            raise ConfigError(f"{origin}: {setting.key}: is {given!r} here, but {setting.option} sets "
                              f"{setting.value!r}: give it in one place, or the same in both")
    node[leaf] = setting.value
