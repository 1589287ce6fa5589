"""The pages a management QUERY answers (design/management.md, QUERY pages). A broker may hold 100,000
queues, more than one message can encode: a QUERY answers one page of what the caller may see and its
`filter` matches, in the order of the items' keys (names), and says where the next page starts. The sorted
matches of recent QUERYs are kept, so paging through them sorts once."""
from __future__ import annotations

import bisect
import fnmatch
import json
import re
from dataclasses import dataclass
from functools import partial
from operator import attrgetter, methodcaller
from typing import Any, Callable, Iterable, NamedTuple

from .access import ADMIN, SEE, Access
from .codec import MAX_NODES, nodes
from .errors import BrokerError, INVALID_FIELD
from .exchange import Binding
from .registry import Registry

# A QUERY answers at most PAGE items (fewer if its `count` says): 500 queues take 20-40 ms to make and encode,
# which every other client's traffic waits for (proton encodes in Python, a value at a time).
PAGE = 500
# The matching items of this many recent QUERYs are kept (until anything is declared or deleted), so paging
# through 100,000 queues sorts them once, not once per page.
LISTINGS_KEPT = 4


@dataclass(frozen=True)
class Listing:
    """What a QUERY of one type lists: its objects (the request's body may narrow them), each one's key (unique:
    the order of the answer, and where a page starts), the names it concerns (the caller sees an object if it
    may SEE one of them, and a `filter` matches if one of them does) and its attributes."""

    objects: Callable[[dict[str, Any]], Iterable[Any]]
    key: Callable[[Any], Any]
    names: Callable[[Any], tuple[str, ...]]
    info: Callable[[Any], dict[str, Any]]
    # Only admins may list them (connections), which change without the registry knowing: listed afresh each time.
    admin_only: bool = False


class _Found(NamedTuple):
    """What one QUERY matches, in the order of `keys` (each item's)."""

    keys: list[Any]
    items: list[Any]


class Listings:
    """The QUERY of each type in `listings` (queues, exchanges, bindings), answered a page at a time. A registry
    observer: what anything declared or deleted changes, it forgets."""

    def __init__(self, registry: Registry, access: Access) -> None:
        self.registry = registry
        self.access = access
        # Recent QUERYs' matches by (type, user, filter, body); dropped when anything is declared or deleted.
        self._found: dict[tuple[str, str | None, str | None, str], _Found] = {}
        registry.observers.append(self)
        by_name, info = attrgetter("name"), methodcaller("info")
        self.listings: dict[str, Listing] = {
            "queue": Listing(lambda body: registry.queues(), by_name, lambda q: (q.name,), info),
            "exchange": Listing(lambda body: registry.exchanges(), by_name, lambda x: (x.name,), info),
            "binding": Listing(self._bindings, lambda b: (b.exchange.name, b.queue.name, b.key),
                               lambda b: (b.queue.name, b.exchange.name), info),
        }

    def query(self, type_: str, props: dict[Any, Any], body: dict[str, Any],
              user: str | None) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
        """One page of what the caller may see and `filter` matches, from `after` (a page's `next`) and
        `offset` on: its items, and `total`, `count` and (if more follow) `next` for the answer's properties."""
        count = min(_whole(props, "count", PAGE), PAGE)
        offset = _whole(props, "offset", 0)
        pattern, after = _text(props, "filter"), _text(props, "after")
        listing = self.listings[type_]
        if listing.admin_only:
            self.access.check(user, ADMIN, f"QUERY {type_}")
        found = self._list(listing, user, pattern, body) if listing.admin_only else \
            self._matching(type_, listing, user, pattern, body)
        start = offset + (0 if after is None else bisect.bisect_right(found.keys, _cursor(after)))
        page = _page(listing.info, found.items[start:start + count])
        end = start + len(page)
        properties: dict[str, Any] = {"total": len(found.items), "count": len(page)}
        if page and end < len(found.items):
            properties["next"] = json.dumps(found.keys[end - 1])
        return 200, page, properties

    def _matching(self, type_: str, listing: Listing, user: str | None, pattern: str | None,
                  body: dict[str, Any]) -> _Found:
        key = (type_, user, pattern, repr(sorted(body.items())))
        found = self._found.get(key)
        if found is None:
            if len(self._found) >= LISTINGS_KEPT:
                self._found.clear()
            found = self._found[key] = self._list(listing, user, pattern, body)
        return found

    def _list(self, listing: Listing, user: str | None, pattern: str | None, body: dict[str, Any]) -> _Found:
        """The listing's objects `user` may see and `pattern` (a glob) matches, in the order of their keys."""
        items = list(listing.objects(body))
        sees = self.seer(user)
        matches = None if pattern is None else re.compile(fnmatch.translate(pattern)).match
        if sees is not None or matches is not None:
            items = [item for item in items if _shown(listing.names(item), sees, matches)]
        items.sort(key=listing.key)
        return _Found([listing.key(item) for item in items], items)

    def seer(self, user: str | None) -> Callable[[str], bool] | None:
        """Whether `user` may see an object of a name (QUERY's permission cut); None: it sees every one (an admin)."""
        return None if self.access.may(user, ADMIN) else partial(self.access.may, user, SEE)

    def _bindings(self, body: dict[str, Any]) -> list[Binding]:
        """Every binding, or those of the body's `exchange` or `queue`."""
        found = self.registry.bindings()
        for field in ("exchange", "queue"):
            if field in body:
                found = [b for b in found if getattr(b, field).name == body[field]]
        return found

    def declared(self, node: Any) -> None:
        """A registry observer: a node or binding came or went, so the kept matches are out of date."""
        self._found.clear()

    def deleted(self, node: Any) -> None:
        self._found.clear()


def _whole(props: dict[Any, Any], key: str, default: int) -> int:
    value = props.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BrokerError(INVALID_FIELD, f"'{key}' must be a whole number >= 0, got {value!r}")
    return int(value)


def _text(props: dict[Any, Any], key: str) -> str | None:
    value = props.get(key)
    if value is not None and not isinstance(value, str):
        raise BrokerError(INVALID_FIELD, f"'{key}' must be a string, got {value!r}")
    return value


def _cursor(after: str) -> Any:
    """The key `after` names: it is the `next` of an earlier answer, the JSON of the last key it listed."""
    try:
        key = json.loads(after)
    except ValueError:
        key = None
    if not isinstance(key, (str, list)):
        raise BrokerError(INVALID_FIELD, f"'after' must be the 'next' of an earlier answer, got {after!r}")
    return tuple(key) if isinstance(key, list) else key


def _shown(names: tuple[str, ...], sees: Callable[[str], bool] | None,
           matches: Callable[[str], Any] | None) -> bool:
    return (sees is None or any(map(sees, names))) and (matches is None or any(map(matches, names)))


def _page(info: Callable[[Any], dict[str, Any]], items: list[Any]) -> list[dict[str, Any]]:
    """The items' attributes, as many as one message body holds (at least one: an answer that cannot be
    encoded becomes a 500 saying so)."""
    page: list[dict[str, Any]] = []
    used = 1  # the list
    for item in items:
        attributes = info(item)
        used += nodes(attributes)
        if page and used > MAX_NODES:  # a page ends before its items would need more, whatever their arguments
            break
        page.append(attributes)
    return page
