"""The build's compiled parts (pyproject.toml holds the project's metadata):

- the audit log's line formatter, written in C (haqueue/audit/_lines.c);
- the hot path's calls into proton, written in C (haqueue/broker/_pn.c);
- AMQP values of the control traffic through proton's codec, from C (haqueue/broker/_values.c);
- the hot path (a message in, a message out, its journal records, its replication, the per-message work of
  priority, groups, last value and scheduled delivery), compiled by mypyc from its own typed
  Python source (design/performance.md). The .py files stay the source of truth: without the compiled
  modules haqueue runs the same code, slower, and while any of them is older than its source
  haqueue/_compiled.py runs them all from source.
"""
from mypyc.build import mypycify
from setuptools import Extension, setup

HOT_PATH = [
    "haqueue/broker/engine.py", "haqueue/broker/loop.py", "haqueue/broker/connection.py",
    "haqueue/broker/tls_pump.py", "haqueue/broker/proton_adapter.py", "haqueue/broker/receive_credit.py",
    "haqueue/broker/links.py", "haqueue/broker/queue.py", "haqueue/broker/message.py",
    "haqueue/broker/completion.py", "haqueue/broker/flow.py", "haqueue/broker/selector.py",
    "haqueue/broker/pass_end.py",
    "haqueue/store/store.py", "haqueue/store/records.py", "haqueue/store/pager.py",
    "haqueue/ha/replicating_subscription.py", "haqueue/ha/queue_replicator.py", "haqueue/ha/quorum.py",
    "haqueue/ha/queue_guard.py", "haqueue/ha/protocol.py",
    "haqueue/shard/relayed_links.py", "haqueue/mirror/queue_mirror.py", "haqueue/audit/queue_observer.py",
    "haqueue/messaging/heaps.py", "haqueue/messaging/priority.py", "haqueue/messaging/groups.py",
    "haqueue/messaging/last_value.py", "haqueue/messaging/scheduled.py",
]

setup(ext_modules=[
    Extension("haqueue.audit._lines", ["haqueue/audit/_lines.c"], extra_compile_args=["-O2", "-Wall", "-Werror"]),
    Extension("haqueue.broker._pn", ["haqueue/broker/_pn.c"], depends=["haqueue/broker/_proton_lib.h"],
              extra_compile_args=["-O2", "-Wall", "-Werror"]),
    Extension("haqueue.broker._values", ["haqueue/broker/_values.c"], depends=["haqueue/broker/_proton_lib.h"],
              extra_compile_args=["-O2", "-Wall", "-Werror"]),
    *mypycify(["--ignore-missing-imports", "--follow-imports=silent", *HOT_PATH], group_name="haqueue._hot_path", opt_level="3"),
])
