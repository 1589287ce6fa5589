"""The `haqueue` command: `haqueue broker ...` runs a broker, `haqueue admin ...` manages one.

Exit codes: 0 done; 1 refused by the broker (statusCode >= 400); 2 usage, config or connection error.
Each subcommand is an `_add_*` function that builds its parser and sets `func`, the function
that runs it, so new subcommands are one more `_add_*` call.
"""
from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Callable

from haqueue.admin import AdminClient, AdminError, Refused
# argparse only: PySpark loads when an audit runs
from haqueue.audit.command import add_lag_arguments, add_watch_arguments, run_lag, run_watch
from haqueue.audit.ship import add_ship_arguments, run_ship
from haqueue.config import (DEFAULT_LISTEN, EXCHANGE_TYPES, SYNC_MODES, ConfigError, MetricsConfig, TlsConfig,
                            config_from_args, load_config, parse_address)

if TYPE_CHECKING:
    from haqueue.shard.cluster_config import Cluster

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

Subparsers = Any  # argparse's _SubParsersAction is private


def _error(message: str) -> None:
    print(f"haqueue: {message}", file=sys.stderr)


# ---- haqueue broker ----------------------------------------------------------------------

def _add_broker(commands: Subparsers) -> None:
    p = commands.add_parser("broker", help="run a broker in the foreground until SIGTERM/SIGINT",
                            description="Run a broker from a config file, or from --listen/--name/--data-dir "
                                        f"(no option at all: listen on {DEFAULT_LISTEN}).")
    p.add_argument("--config", metavar="FILE", help="YAML config file (design/management.md)")
    p.add_argument("--listen", metavar="HOST:PORT", action="append", default=[], help="listen here (repeatable)")
    p.add_argument("--name", help="broker name (default: the host name)")
    p.add_argument("--data-dir", metavar="DIR", help="where the broker keeps state (default: ./data)")
    p.add_argument("--metrics", metavar="HOST:PORT", type=_address,
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (with --config: in place of its "
                        "metrics section)")
    p.add_argument("--node", help="with --config of a sharded cluster: the node this process runs on")
    p.add_argument("--shard", metavar="I", type=int, help="with --config of a sharded cluster: the shard it serves")
    p.set_defaults(func=_broker)


def _broker(args: argparse.Namespace) -> int:
    if args.config and (args.listen or args.name is not None or args.data_dir is not None):
        _error("broker: --config cannot be combined with --listen, --name or --data-dir")
        return EXIT_USAGE
    if (args.node is None) != (args.shard is None) or (args.node is not None and not args.config):
        _error("broker: --node and --shard go together, with --config of a sharded cluster")
        return EXIT_USAGE
    try:
        if args.node is not None:
            from haqueue.shard.cluster_config import shard_process_config
            config = shard_process_config(args.config, args.node, args.shard)
        elif args.config:
            config = load_config(args.config)
        else:
            config = config_from_args(args.listen, args.name, args.data_dir)
    except ConfigError as e:
        _error(str(e))
        return EXIT_USAGE
    if args.metrics:  # checked by argparse
        config.metrics = MetricsConfig(parse_address(args.metrics))
    if config.ha is not None and config.ha.coordinator == "zookeeper":
        try:
            import kazoo  # noqa: F401
        except ImportError:
            _error("ha.coordinator zookeeper needs kazoo: pip install 'haqueue[zk]'")
            return EXIT_USAGE
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=LOG_FORMAT)
    from haqueue.broker.server import Broker, run  # lazily: admin commands need none of the broker

    def plugins(broker: Broker) -> None:
        from haqueue.messaging import install as install_messaging
        # first: queues the store recovers get their delivery rules too
        install_messaging(broker, config.shard is not None)
        store = None
        if config.store.enabled:
            from haqueue.store import Store
            store = Store(broker, config.store)
        ha = None
        if config.ha is not None:
            from haqueue.ha import HaBroker
            ha = HaBroker(broker, config.ha)
            if config.ha.coordinator == "zookeeper":
                if config.shard is not None and config.ha.zookeeper is not None:
                    # first: a process of another placement must not join
                    from haqueue.shard.stored_assignment import check_stored_assignment
                    check_stored_assignment(config.shard, config.ha.zookeeper)
                from haqueue.coord.zookeeper import ZooKeeperCoordinator
                ZooKeeperCoordinator(ha)
            if config.shard is not None:  # one shard's process of a sharded cluster
                from haqueue.shard.plugin import install
                install(broker, ha, config.shard)
        if config.mirror is not None:  # after HA: it mirrors from the primary alone
            from haqueue.mirror import install as install_mirror
            install_mirror(broker, ha, config.mirror)
        if config.audit is not None:  # after HA: it records HA's role, epoch and replication
            from haqueue.audit.events import AuditLog
            AuditLog(broker, config.audit, ha, config.shard.index if config.shard is not None else None)
        if config.metrics is not None:
            from haqueue.metrics import serve_metrics
            serve_metrics(broker, config.metrics, ha, store)
        if config.http is not None:  # last: it reads what the others add (HA's role, the shard map)
            from haqueue.console import serve_console
            serve_console(broker, config.http, ha, config.shard, config.audit.dir if config.audit else None)
    return run(config, [plugins])


# ---- haqueue admin -----------------------------------------------------------------------

Action = Callable[[AdminClient, argparse.Namespace], None]


def _call(client: AdminClient, operation: str, type: str, name: str | None = None,
          body: dict | None = None) -> Any:
    code, description, answer = client.request(operation, type, name, body)
    if code >= 400:
        raise Refused(code, description)
    return answer


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=str), flush=True)  # default: AMQP types JSON lacks (timestamps, binary, ...)


def _key_value(text: str) -> tuple[str, Any]:
    """--arg KEY=VALUE; VALUE is JSON when it parses (10, 2.5, true), else a plain string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _address(text: str) -> str:
    try:
        parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _add_action(commands: Subparsers, name: str, action: Action, help: str) -> argparse.ArgumentParser:
    p = commands.add_parser(name, help=help, description=help)
    p.set_defaults(func=_admin, action=action)
    return p


def _add_arg_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arg", metavar="KEY=VALUE", dest="args", action="append", type=_key_value, default=[],
                   help="an argument; VALUE is JSON if it parses, else a string (repeatable)")


def _add_admin(commands: Subparsers) -> None:
    p = commands.add_parser("admin", help="manage a running broker through its $management node")
    p.add_argument("-b", "--broker", metavar="HOST:PORT", type=_address, default=DEFAULT_LISTEN,
                   help=f"the broker (default {DEFAULT_LISTEN})")
    p.add_argument("--timeout", metavar="S", type=float, default=10.0, help="seconds to wait for the broker")
    p.add_argument("--user", help="SASL PLAIN user (default: no SASL)")
    p.add_argument("--password", default=os.environ.get("HAQUEUE_PASSWORD"),
                   help="SASL PLAIN password (default: $HAQUEUE_PASSWORD, which keeps it out of ps)")
    tls = p.add_argument_group("TLS (a broker's peer listener under ha.tls: give all three)")
    tls.add_argument("--tls-ca", metavar="FILE", help="accept the broker only with a certificate signed by this CA")
    tls.add_argument("--tls-cert", metavar="FILE", help="present this certificate")
    tls.add_argument("--tls-key", metavar="FILE", help="the certificate's private key")
    actions = p.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)
    _add_action(actions, "status", _status, "print the broker's status as one JSON object")
    stat = _add_action(actions, "stat", _stat, "a terminal view of the broker's queues (depth, bytes, message "
                                               "rates, consumers) and, on a primary, its backups (state, lag, "
                                               "catch-up), like qpid-stat -q; rates over --interval")
    _add_watch_options(stat)
    _add_queue(actions)
    _add_exchange(actions)
    _add_binding(actions)
    _add_connection(actions)
    _add_ha(actions)
    _add_mirror(actions)
    _add_admin_cluster(actions)
    store = actions.add_parser("store", help="the broker's durable store")
    store_actions = store.add_subparsers(dest="store_command", metavar="COMMAND", required=True)
    _add_action(store_actions, "status", _store_status,
                "print the journal's segments, bytes, live messages, position and last fsync latency as JSON")


def _admin(args: argparse.Namespace) -> int:
    timeout = getattr(args, "ping_timeout", None) or args.timeout
    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if any(given) and not all(given):
        _error("admin: --tls-ca, --tls-cert and --tls-key go together")
        return EXIT_USAGE
    tls = TlsConfig(args.tls_cert, args.tls_key, args.tls_ca) if all(given) else None
    try:
        with AdminClient(args.broker, timeout, args.user, args.password, tls) as client:
            args.action(client, args)
    except Refused as e:  # an AdminError too: the broker answered, and said no
        _error(str(e))
        return EXIT_REFUSED
    except AdminError as e:
        _error(str(e))
        return EXIT_USAGE
    return EXIT_OK


def _status(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_call(client, "READ", "broker"))


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) > 0):
        raise argparse.ArgumentTypeError(f"must be a whole number above 0, got {text!r}")
    return int(text)


def _add_watch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--watch", action="store_true", help="show it again every --interval until Ctrl-C")
    p.add_argument("--interval", metavar="S", type=_positive_seconds, default=1.0,
                   help="seconds between two looks (default 1)")
    p.add_argument("--count", metavar="N", type=_positive_int, help="show it N times, --interval apart (--watch "
                                                                    "that stops)")


def _watching(args: argparse.Namespace) -> bool:
    return args.watch or args.count is not None


def _stat(client: AdminClient, args: argparse.Namespace) -> None:
    from haqueue.admin_stat import run
    run(lambda operation, type_: list(client.query(type_)) if operation == "QUERY" else _call(client, operation, type_),
        args.interval, _watching(args), args.count, _write, sys.stdout.isatty())


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _store_status(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_call(client, "READ", "store"))


def _add_queue(actions: Subparsers) -> None:
    p = actions.add_parser("queue", help="add, delete or list queues")
    sub = p.add_subparsers(dest="queue_command", metavar="COMMAND", required=True)
    add = _add_action(sub, "add", _queue_add, "declare a queue; prints its attributes")
    add.add_argument("name")
    _add_arg_option(add)
    _add_action(sub, "del", _queue_del, "delete a queue").add_argument("name")
    _add_action(sub, "purge", _queue_purge, "drop every message no consumer holds; prints how many went").add_argument(
        "name")
    peek = _add_action(sub, "peek", _queue_peek, "print the first messages (seq, state, message as base64 AMQP) "
                                                 "without taking them, one JSON object a line")
    peek.add_argument("name")
    peek.add_argument("--count", metavar="N", type=_whole_number, default=10, help="how many (default 10, at most 100)")
    _add_list(sub, "queue", "print one JSON object per queue (name, depth, consumers, args), by name")


def _queue_add(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_call(client, "CREATE", "queue", args.name, dict(args.args)))


def _queue_del(client: AdminClient, args: argparse.Namespace) -> None:
    _call(client, "DELETE", "queue", args.name)


def _queue_purge(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_call(client, "PURGE", "queue", args.name))


def _queue_peek(client: AdminClient, args: argparse.Namespace) -> None:
    import base64
    for item in _call(client, "PEEK", "queue", args.name, {"count": args.count}):
        _print_json({**item, "message": base64.b64encode(item["message"]).decode()})


def _add_list(sub: Subparsers, type_: str, help: str) -> None:
    p = _add_action(sub, "list", lambda client, args: _print_listing(client, type_, args), help)
    p.add_argument("--filter", metavar="PATTERN", help=f"only {type_}s whose name matches this glob (* matches "
                                                       f"dots too; quote it from the shell)")
    p.add_argument("--offset", metavar="N", type=_whole_number, default=0, help=f"skip the first N {type_}s")
    p.add_argument("--limit", metavar="N", type=_positive_int, help=f"print at most N {type_}s (default: all, "
                                                                    f"fetched a page at a time)")


def _whole_number(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}")
    return int(text)


def _print_listing(client: AdminClient, type_: str, args: argparse.Namespace) -> None:
    """Each item of a QUERY as a JSON line, page by page (design/management.md)."""
    for item in client.query(type_, args.filter, offset=args.offset, limit=args.limit):
        _print_json(item)


def _add_exchange(actions: Subparsers) -> None:
    p = actions.add_parser("exchange", help="add, delete or list exchanges")
    sub = p.add_subparsers(dest="exchange_command", metavar="COMMAND", required=True)
    add = _add_action(sub, "add", _exchange_add, "declare an exchange; prints its attributes")
    add.add_argument("name")
    add.add_argument("--type", required=True, choices=EXCHANGE_TYPES)
    _add_arg_option(add)
    _add_action(sub, "del", _exchange_del, "delete an exchange").add_argument("name")
    _add_list(sub, "exchange", "print one JSON object per exchange (name, type, args), by name")


def _exchange_add(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_call(client, "CREATE", "exchange", args.name, {**dict(args.args), "type": args.type}))


def _exchange_del(client: AdminClient, args: argparse.Namespace) -> None:
    _call(client, "DELETE", "exchange", args.name)


def _add_binding(actions: Subparsers) -> None:
    for name, action, help in (("bind", _bind, "bind a queue to an exchange"),
                               ("unbind", _unbind, "remove a binding")):
        p = _add_action(actions, name, action, help)
        p.add_argument("exchange")
        p.add_argument("queue")
        p.add_argument("--key", default="", help="binding key (default: empty)")


def _add_connection(actions: Subparsers) -> None:
    p = actions.add_parser("connection", help="list or close client connections (admin)")
    sub = p.add_subparsers(dest="connection_command", metavar="COMMAND", required=True)
    _add_list(sub, "connection", "print one JSON object per connection (name: its peer address, user, container, "
                                 "links), by name")
    close = _add_action(sub, "close", _connection_close, "close a connection (amqp:connection:forced)")
    close.add_argument("name", help="the connection's name in `connection list` (its peer address)")


def _connection_close(client: AdminClient, args: argparse.Namespace) -> None:
    _call(client, "DELETE", "connection", args.name, {"reason": "closed by an administrator (haqueue admin)"})


def _binding(args: argparse.Namespace) -> dict[str, str]:
    return {"exchange": args.exchange, "queue": args.queue, "key": args.key}


def _bind(client: AdminClient, args: argparse.Namespace) -> None:
    _call(client, "CREATE", "binding", body=_binding(args))


def _unbind(client: AdminClient, args: argparse.Namespace) -> None:
    _call(client, "DELETE", "binding", body=_binding(args))


# ---- entry point -------------------------------------------------------------------------

class _Version(argparse.Action):
    """--version: the release and replication protocols, imported only when asked (they load HA's modules)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from haqueue.release import version_line
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="haqueue", description="A replicated AMQP 1.0 broker.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the release and the replication protocols it speaks, and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_broker(commands)
    _add_admin(commands)
    _add_cluster(commands)
    _add_audit(commands)
    _add_store(commands)
    _add_diverged(commands)
    _add_passwd(commands)
    _add_place(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse exits on usage errors (2) and --help (0); return the code instead
        return e.code if isinstance(e.code, int) else EXIT_OK
    from haqueue.formats import EXIT_NEWER_FORMAT, NewerFormat
    try:
        return args.func(args)
    except NewerFormat as e:  # a file of a newer release, left as it was (a broker's start, or a command reading it)
        _error(str(e))
        return EXIT_NEWER_FORMAT



def _add_ha(actions: Subparsers) -> None:
    p = actions.add_parser("ha", help="HA role and status")
    sub = p.add_subparsers(dest="ha_command", metavar="COMMAND", required=True)
    status = _add_action(sub, "status", _ha_status, "print role, state, epoch, brokers (and backups on a primary, "
                                                    "with lag and catch-up progress) as JSON; with --watch, one "
                                                    "object a line every --interval")
    _add_watch_options(status)
    promote = _add_action(sub, "promote", _ha_promote, "make this backup the primary (refused unless ready)")
    promote.add_argument("--force", action="store_true", help="promote even if the backup is not ready")
    ping = _add_action(sub, "ping", _ha_ping, "exit 0 only if the broker answers in time")
    ping.add_argument("--timeout", dest="ping_timeout", metavar="S", type=float, default=None,
                      help="seconds to wait (default: the admin --timeout)")


def _ha_status(client: AdminClient, args: argparse.Namespace) -> None:
    from haqueue.admin_stat import repeat
    repeat(lambda: _print_json(_call(client, "READ", "ha")), args.interval, _watching(args), args.count,
           wait_first=False)


def _ha_promote(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_call(client, "PROMOTE", "ha", body={"force": args.force}))


def _ha_ping(client: AdminClient, args: argparse.Namespace) -> None:
    _call(client, "READ", "broker")


def _add_mirror(actions: Subparsers) -> None:
    p = actions.add_parser("mirror", help="the mirror to (or from) another cluster (design/mirroring.md)")
    sub = p.add_subparsers(dest="mirror_command", metavar="COMMAND", required=True)
    status = _add_action(sub, "status", _mirror_status, "print the mirror as JSON: on a source's primary each "
                                                        "mirrored queue's state, lag (messages, seconds), last "
                                                        "mirrored seq and bytes held back; on a standby each "
                                                        "mirror queue held")
    _add_watch_options(status)
    promote = _add_action(sub, "promote", _mirror_promote, "on a standby: make its mirror queues writable and fence "
                                                           "off their sources (a higher mirror epoch); refused while "
                                                           "a source is mirroring into it")
    promote.add_argument("--force", action="store_true", help="promote even while a source is mirroring into it")
    reverse = _add_action(sub, "reverse", _mirror_reverse, "on a promoted standby (fail-back): mirror back, at a "
                                                           "higher mirror epoch, to the cluster it was promoted over "
                                                           "(its mirror.to); there its queues become mirrors of "
                                                           "these, what they held that was never mirrored kept "
                                                           "aside (haqueue diverged list)")
    reverse.add_argument("--of", metavar="CLUSTER", help="the cluster to mirror back to, when it holds mirrors of "
                                                         "several")


def _mirror_status(client: AdminClient, args: argparse.Namespace) -> None:
    from haqueue.admin_stat import repeat
    repeat(lambda: _print_json(_mirror_call(client, "READ")), args.interval, _watching(args), args.count,
           wait_first=False)


def _mirror_promote(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_mirror_call(client, "PROMOTE", {"force": args.force}))


def _mirror_reverse(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_mirror_call(client, "REVERSE", {"of": args.of} if args.of else {}))


def _mirror_call(client: AdminClient, operation: str, body: dict | None = None) -> Any:
    """A mirror operation. Which a broker has depends on its `mirror:` section (none without one; PROMOTE and REVERSE
    only with accept_from); one it lacks is answered 501, "unknown operation", and said here for what it is."""
    try:
        return _call(client, operation, "mirror", body=body)
    except Refused as e:
        if e.code != 501:
            raise
        if operation != "READ" and client.request("READ", "mirror")[0] < 400:
            raise Refused(e.code, f"{client.address} is not a standby: its mirror: section accepts no mirror "
                                  f"(mirror.accept_from)") from None
        raise Refused(e.code, f"no mirror configured on {client.address}: its config has no mirror: section "
                              f"(design/mirroring.md)") from None


def _add_admin_cluster(actions: Subparsers) -> None:
    p = actions.add_parser("cluster", help="the cluster: a sharded one's status (design/sharding.md), feature flags "
                                           "and upgrade checks (design/upgrades.md)")
    sub = p.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    status = _add_action(sub, "status", _cluster_status,
                         "asked of any process of a sharded cluster: per shard its primary, preferred primary, "
                         "backups with state and lag, and epoch; per node its processes and their roles (reads "
                         "every process's ha status at its peer address)")
    status.add_argument("--format", choices=("json", "table"), default="json",
                        help="one JSON object (default), or tables for people")
    features = _add_action(sub, "features", _features,
                           "asked of the primary: the cluster's feature flags, each enabled or not and which members "
                           "support it, as JSON (design/upgrades.md)")
    enable = _add_action(features.add_subparsers(dest="features_command", metavar="COMMAND"), "enable",
                         _features_enable, "turn a feature on for the whole cluster; refused unless every member "
                                           "follows the primary and supports it; there is no way back")
    enable.add_argument("feature")
    _add_action(sub, "upgrade-check", _upgrade_check,
                "asked of the primary: whether the cluster can take the next step of a rolling upgrade (every "
                "member here and ready, no peer refused for its protocol), as JSON; exit 1 if not")


def _features(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_call(client, "READ", "features"))


def _features_enable(client: AdminClient, args: argparse.Namespace) -> None:
    _print_json(_call(client, "ENABLE", "features", args.feature))


def _upgrade_check(client: AdminClient, args: argparse.Namespace) -> None:
    check = _call(client, "READ", "upgrade-check")
    _print_json(check)
    if not check["ok"]:
        raise Refused(409, f"not yet: {'; '.join(check['blockers'])}")


def _cluster_status(client: AdminClient, args: argparse.Namespace) -> None:
    from haqueue.shard.status import cluster_status, read_all, to_table
    try:
        layout = _call(client, "READ", "cluster")
    except Refused as e:
        if e.code == 501:  # no such operation
            raise Refused(e.code, f"{client.address} is not a process of a sharded cluster") from None
        raise

    def read(address: str) -> dict[str, Any]:
        with client.elsewhere(address) as other:
            return _call(other, "READ", "ha")
    status = cluster_status(layout, read_all(layout, read))
    if args.format == "table":
        print(to_table(status), flush=True)
    else:
        _print_json(status)


# ---- haqueue passwd ----------------------------------------------------------------------

def _add_passwd(commands: Subparsers) -> None:
    p = commands.add_parser("passwd", help="print a salted hash of a password, for users.NAME.password_hash",
                            description="Read a password (asked twice on a terminal; else the first line of "
                                        "stdin) and print a salted scrypt hash of it for the config's "
                                        "users.NAME.password_hash. The password is never an argument: ps would "
                                        "show it.")
    p.set_defaults(func=_passwd)


def _passwd(args: argparse.Namespace) -> int:
    from haqueue.passwords import make_hash
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            _error("passwd: the two passwords differ")
            return EXIT_USAGE
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        _error("passwd: the password is empty")
        return EXIT_USAGE
    print(make_hash(password))
    return EXIT_OK


# ---- haqueue cluster ---------------------------------------------------------------------

def _add_cluster(commands: Subparsers) -> None:
    p = commands.add_parser("cluster", help="run a local HA cluster")
    sub = p.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    up = sub.add_parser("up", help="run N brokers as a hot-standby cluster in the foreground",
                        description="Run N brokers as a local hot-standby cluster; the first is promoted, and when "
                                    "the primary dies the most up-to-date ready backup takes over.")
    up.add_argument("--size", type=int, default=3, help="number of brokers (default 3); with --shards, of nodes")
    up.add_argument("--shards", type=int, help="a sharded cluster (design/sharding.md): K shards over --size nodes "
                                               "127.0.0.1, 127.0.0.2, ..., each node's client address on --public's "
                                               "port; shard i's peers on base-port + i, its own address on "
                                               "127.0.0.1:base-port + K + i")
    up.add_argument("--replicas", type=int, help="with --shards: replicas of each shard (default min(3, size))")
    up.add_argument("--dir", default="./cluster", help="configs, data and logs (default ./cluster)")
    up.add_argument("--public", type=_address, default=DEFAULT_LISTEN,
                    help=f"the clients' address, bound by the primary (default {DEFAULT_LISTEN})")
    up.add_argument("--base-port", type=int, default=5701, help="broker i listens on base-port + i (default 5701)")
    up.add_argument("--config", metavar="FILE", help="a broker config (YAML, as `haqueue broker --config` takes it) "
                                                     "every broker starts from: users, anonymous, limits, store, "
                                                     "queues, audit, http.tls, ha.sync...; what cluster up sets "
                                                     "itself (name, listen, data_dir, ha.brokers, ha.public, the HA "
                                                     "peer user, http.listen) is refused, naming the option to use")
    up.add_argument("--audit-dir", metavar="DIR", help="each broker writes audit events in a directory of its own "
                                                       "here, DIR/NAME (design/audit-events.md)")
    up.add_argument("--sync", choices=SYNC_MODES,
                    help="ha.sync of every broker: when a publish is confirmed (design/store.md; default all)")
    up.add_argument("--tls", metavar="DIR", help="brokers talk to each other (and the supervisor to them) over TLS "
                                                 "with DIR/ca.pem, DIR/cert.pem and DIR/key.pem (ha.tls)")
    up.add_argument("--console-port", type=int, default=CONSOLE_PORT, metavar="PORT",
                    help=f"broker i serves the web console on 127.0.0.1:PORT + i (default {CONSOLE_PORT}; "
                         f"0: none); with --shards, shard i's processes on their node's address, PORT + i")
    up.add_argument("--mirror-to", metavar="HOST:PORT", type=_address,
                    help="mirror the queues matching --mirror-queues to the standby cluster whose clients' address "
                         "this is, as --mirror-user, password $HAQUEUE_MIRROR_PASSWORD (design/mirroring.md); this "
                         "cluster is named after --dir's last part")
    up.add_argument("--mirror-queues", metavar="GLOB", action="append", default=[],
                    help="with --mirror-to: the queues mirrored (repeatable)")
    up.add_argument("--accept-mirror", action="store_true",
                    help="a standby: accept a mirror from user --mirror-user, password $HAQUEUE_MIRROR_PASSWORD")
    up.add_argument("--mirror-user", metavar="USER", default="mirror",
                    help="the standby's user a source mirrors as (default mirror)")
    up.set_defaults(func=_cluster_up)


# cluster up's first web console; not 15672, RabbitMQ management's, so that both run on one machine
CONSOLE_PORT = 8672


def _cluster_up(args: argparse.Namespace) -> int:
    if args.size < 1:
        _error("--size must be at least 1")
        return EXIT_USAGE
    if args.replicas is not None and args.shards is None:
        _error("--replicas goes with --shards")
        return EXIT_USAGE
    if bool(args.mirror_to) != bool(args.mirror_queues):
        _error("--mirror-to and --mirror-queues go together: where to mirror, and which queues")
        return EXIT_USAGE
    if args.shards is not None and (args.mirror_to or args.accept_mirror):
        _error("a sharded cluster is not mirrored yet (design/mirroring.md): no --mirror-to nor --accept-mirror "
               "with --shards")
        return EXIT_USAGE
    from haqueue.coord.up_config import NO_FILE, MirrorOptions, cluster_settings
    origin = args.config or NO_FILE
    mirror = MirrorOptions(os.path.basename(os.path.abspath(args.dir)), args.mirror_to, args.mirror_queues,
                           args.mirror_user, args.accept_mirror)
    try:
        extra = cluster_settings(args.config, args.audit_dir, args.sync, args.tls, args.console_port != 0, mirror)
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=LOG_FORMAT)
        if args.shards is not None:
            from haqueue.shard.local_cluster import sharded_cluster_up
            replicas = min(3, args.size) if args.replicas is None else args.replicas
            return sharded_cluster_up(args.size, args.shards, replicas, args.dir, parse_address(args.public)[1],
                                      args.base_port, extra, args.console_port, origin)
        from haqueue.coord.supervisor import cluster_up
        return cluster_up(args.size, args.dir, parse_address(args.public), args.base_port, extra, args.console_port,
                          origin)
    except ConfigError as e:  # raised before any broker starts
        _error(str(e))
        return EXIT_USAGE


# ---- haqueue place -----------------------------------------------------------------------

def _add_place(commands: Subparsers) -> None:
    p = commands.add_parser("place", help="print where each shard's replicas go, or how to move them",
                            description="Print which nodes hold each shard's replicas, the preferred primary first "
                                        "(shard i on nodes (i + j) mod n, no two replicas in one rack where racks "
                                        "allow). With --from, rebalance that earlier assignment onto --nodes, "
                                        "moving as few replicas as possible, and print the moves. "
                                        "design/sharding.md has the rules.")
    p.add_argument("--config", metavar="CLUSTER", help="the placement of this cluster file (its nodes, racks, regions, "
                                                      "shards and replicas); in JSON also its pacemaker: VIPs")
    p.add_argument("--nodes", metavar="N1,N2,...", type=lambda text: text.split(","),
                   help="the nodes, comma-separated (required without --config)")
    p.add_argument("--shards", type=int, metavar="K", help="number of shards (required without --from)")
    p.add_argument("--replicas", type=int, metavar="R", help="replicas per shard (required without --from)")
    for option, what in (("--rack", "RACK"), ("--region", "REGION")):
        p.add_argument(option, metavar=f"NODE={what}", action="append", default=[], type=_node_label,
                       help=f"the node's {what.lower()} (repeatable: every node or none)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format (default table)")
    p.add_argument("--from", dest="old", metavar="OLD.json", help="an earlier `place --format json` to rebalance")
    p.add_argument("--store", action="store_true",
                   help="with --config under ha.coordinator zookeeper: make the file's placement the cluster's "
                        "stored assignment (ha.zookeeper.path/assignment), which every process checks at start")
    p.add_argument("--replace", action="store_true",
                   help="with --store: replace a different stored assignment (processes of the old placement then "
                        "no longer start); without it, a different one is left and reported (exit 1)")
    p.set_defaults(func=_place)


def _node_label(text: str) -> tuple[str, str]:
    node, sep, label = text.partition("=")
    if not sep or not node or not label:
        raise argparse.ArgumentTypeError(f"expected NODE=VALUE, got {text!r}")
    return node, label


def _place(args: argparse.Namespace) -> int:
    from haqueue.shard.assignment import from_json, to_json, to_table
    from haqueue.shard.errors import ShardError
    from haqueue.shard.placement import place
    from haqueue.shard.rebalance import rebalance, replica_count
    from haqueue.shard.topology import Topology
    if args.config is not None:
        return _place_cluster(args)
    if args.store or args.replace:
        _error("place: --store needs --config: the assignment stored is the one a cluster file's processes derive "
               "and check at start")
        return EXIT_USAGE
    try:
        if args.nodes is None:
            raise ShardError("--nodes is required (or --config a cluster file)")
        topology = Topology.of(args.nodes, _labels("--rack", args.rack), _labels("--region", args.region))
        if args.old is None:
            if args.shards is None or args.replicas is None:
                raise ShardError("--shards and --replicas are required (or --from an earlier assignment)")
            placement = place(topology, args.shards, args.replicas)
        else:
            with open(args.old, encoding="utf-8") as f:
                old, old_nodes = from_json(f.read(), args.old)
            for option, given, held in (("--shards", args.shards, len(old)), ("--replicas", args.replicas,
                                                                             replica_count(old))):
                if given is not None and given != held:
                    raise ShardError(f"{option} {given}, but {args.old} has {held}: --from keeps the shards and "
                                     f"replicas of the assignment it rebalances")
            placement = rebalance(old, old_nodes, topology)
    except ShardError as e:
        _error(f"place: {e}")
        return EXIT_USAGE
    except OSError as e:
        _error(f"place: {args.old}: cannot read: {e.strerror}")
        return EXIT_USAGE
    for warning in placement.warnings:
        _error(f"place: warning: {warning}")
    with_moves = args.old is not None
    if args.format == "json":
        print(json.dumps(to_json(placement, with_moves)))
    else:
        print(to_table(placement, with_moves))
    return EXIT_OK


def _place_cluster(args: argparse.Namespace) -> int:
    """The placement a cluster file's processes derive (pcs-shard-setup.sh reads it, with the file's VIPs)."""
    from dataclasses import asdict

    from haqueue.shard.assignment import to_json, to_table
    from haqueue.shard.cluster_config import load_cluster
    if args.nodes or args.shards or args.replicas or args.rack or args.region or args.old:
        _error("place: --config takes the nodes, shards and replicas from the cluster file: give no other option")
        return EXIT_USAGE
    if args.replace and not args.store:
        _error("place: --replace is for --store")
        return EXIT_USAGE
    try:
        cluster = load_cluster(args.config)
    except ConfigError as e:
        _error(f"place: {e}")
        return EXIT_USAGE
    for warning in cluster.placement.warnings:
        _error(f"place: warning: {warning}")
    if args.store:
        status = _store_assignment(cluster, args.replace)
        if status != EXIT_OK:
            return status
    if args.format == "json":
        document = to_json(cluster.placement, with_moves=False)
        if cluster.pacemaker is not None:
            document["pacemaker"] = asdict(cluster.pacemaker)
        print(json.dumps(document))
    else:
        print(to_table(cluster.placement, with_moves=False))
    return EXIT_OK


def _store_assignment(cluster: "Cluster", replace: bool) -> int:
    """`place --config CLUSTER --store [--replace]`: the file's placement made the cluster's stored assignment."""
    from haqueue.coord.zookeeper import ZooKeeperUnusable
    from haqueue.shard.cluster_config import process_config
    from haqueue.shard.stored_assignment import AssignmentRefused, store
    try:  # any process's config: every one has the cluster's ZooKeeper and assignment
        config = process_config(cluster, cluster.placement.shards[0][0], 0)
    except ConfigError as e:
        _error(f"place: {e}")
        return EXIT_USAGE
    if config.ha is None or config.ha.zookeeper is None or config.shard is None:
        _error(f"place: --store: {cluster.origin} has no ha.coordinator: zookeeper; only ZooKeeper stores the "
               f"assignment")
        return EXIT_USAGE
    try:
        _error(f"place: {store(config.shard, config.ha.zookeeper, replace)}")
    except (AssignmentRefused, ZooKeeperUnusable) as e:
        _error(f"place: {e}")
        return EXIT_REFUSED
    return EXIT_OK


def _labels(option: str, pairs: list[tuple[str, str]]) -> dict[str, str]:
    from haqueue.shard.errors import ShardError
    labels: dict[str, str] = {}
    for node, label in pairs:
        if node in labels:
            raise ShardError(f"{option}: node {node!r} given twice")
        labels[node] = label
    return labels


# ---- haqueue store -----------------------------------------------------------------------

def _add_store(commands: Subparsers) -> None:
    p = commands.add_parser("store", help="the durable store, offline")
    sub = p.add_subparsers(dest="store_command", metavar="COMMAND", required=True)
    check = sub.add_parser("check", help="verify a broker's data dir without changing it",
                           description="Read every journal segment of a broker's data dir (the broker stopped) "
                                       "and print what it holds as JSON. Exit 0 if it reads back (a torn tail, "
                                       "which the broker truncates at start, is reported), 1 on corruption, 2 "
                                       "if there is no journal.")
    check.add_argument("data_dir", metavar="DIR", help="the broker's data_dir (its journal is DIR/journal)")
    check.set_defaults(func=_store_check)


def _store_check(args: argparse.Namespace) -> int:
    from haqueue.store.check import check
    return check(args.data_dir)


# ---- haqueue diverged --------------------------------------------------------------------

def _add_diverged(commands: Subparsers) -> None:
    p = commands.add_parser("diverged", help="messages a rejoining broker held that the new primary never had")
    sub = p.add_subparsers(dest="diverged_command", metavar="COMMAND", required=True)
    listing = sub.add_parser("list", help="print each diverged file of a broker's data dir as a JSON line",
                             description="Print each diverged file not yet republished (file, queue, messages, "
                                         "seqs) of a broker's data dir, one JSON object a line.")
    listing.add_argument("data_dir", metavar="DIR", help="the broker's data_dir (its files are DIR/diverged/)")
    listing.set_defaults(func=_diverged_list)
    again = sub.add_parser("republish", help="send every diverged message to its queue on the primary",
                           description="Send each message of the data dir's diverged files to its queue at "
                                       "--to (the primary, or the cluster's public address), each accepted "
                                       "before the next; a file done is renamed *.republished, so running it "
                                       "again sends nothing twice. Exit 1 on the first refusal.")
    again.add_argument("data_dir", metavar="DIR", help="the broker's data_dir")
    again.add_argument("--to", metavar="HOST:PORT", required=True, type=_address, help="the primary")
    again.add_argument("--user", help="SASL PLAIN user (default: no SASL)")
    again.add_argument("--password", default=os.environ.get("HAQUEUE_PASSWORD"),
                       help="SASL PLAIN password (default: $HAQUEUE_PASSWORD)")
    again.add_argument("--timeout", metavar="S", type=float, default=10.0, help="seconds to wait for each answer")
    again.set_defaults(func=_diverged_republish)


def _diverged_list(args: argparse.Namespace) -> int:
    from haqueue.diverged import describe, print_lines
    print_lines(describe(args.data_dir))
    return EXIT_OK


def _diverged_republish(args: argparse.Namespace) -> int:
    from haqueue.diverged import print_lines, republish
    try:
        print_lines(republish(args.data_dir, args.to, args.user, args.password, args.timeout))
    except (RuntimeError, OSError) as e:
        _error(str(e))
        return EXIT_REFUSED
    return EXIT_OK


# ---- haqueue audit -----------------------------------------------------------------------

def _add_audit(commands: Subparsers) -> None:
    p = commands.add_parser("audit", help="analyse the brokers' audit events (needs the spark extra)")
    sub = p.add_subparsers(dest="audit_command", metavar="COMMAND", required=True)
    lag = sub.add_parser("lag", help="replication lag, loss, duplicates and order per queue and backup",
                         description="Read a directory of audit events with PySpark and report, per queue and "
                                     "backup, replication lag, confirmed messages missing on a ready backup, "
                                     "duplicates, order violations and dequeues not mirrored; with --ledger, what "
                                     "clients confirmed and received: lost, duplicated, unexpected. Writes Parquet and "
                                     "CSV tables and a PNG chart to --out and a summary to stdout. Exits 4 if the "
                                     "audit cannot run (the Spark job fails), 2 on a usage error.")
    add_lag_arguments(lag)
    lag.set_defaults(func=run_lag)
    watch = sub.add_parser("watch", help="live replication lag and missing copies per queue and backup",
                           description="Follow the brokers' audit events as they are written with Spark Structured "
                                       "Streaming and print, per window, the replication lag percentiles per queue "
                                       "and backup, and every confirmed message a ready backup did not log within "
                                       "--bound (MISSING). Runs until interrupted, --for SECONDS, or --once.")
    add_watch_arguments(watch)
    watch.set_defaults(func=run_watch)
    ship = sub.add_parser("ship", help="copy a broker's closed event files to a shared directory, each once",
                          description="Run on each broker's node: copy the broker's closed (rotated) event files "
                                      "to a directory every Spark executor reads, each exactly once and whole, "
                                      "resuming where a killed run stopped; the file a broker still writes waits "
                                      "until it is closed (audit.max_bytes, audit.rotate_seconds, exit). Exits 2 on "
                                      "a usage error, 4 if a file could not be shipped (--once).")
    add_ship_arguments(ship)
    ship.set_defaults(func=run_ship)


if __name__ == "__main__":
    sys.exit(main())
