"""Selectors: the grammar, JMS's three-valued logic, the identifiers read from a message's sections
(haqueue/broker/selector.py), and how a queue dispatches to selector consumers and browsers
(haqueue/broker/queue.py; design/selectors.md)."""
from __future__ import annotations

import time
import uuid

import pytest
from proton import Message, char, symbol, timestamp, ulong
from proton import byte as amqp_byte
from proton import int32, short

from haqueue.broker import queue as queue_module
from haqueue.broker.queue import AVAILABLE, SCAN_BUDGET, Queue
from haqueue.broker.selector import MessageFields, SelectorError, compile_selector


def encoded(**kw) -> bytes:
    return bytes(Message(**kw).encode())


def matches(selector: str, **message) -> bool:
    return compile_selector(selector).matches(MessageFields(encoded(**message)))


PROPS = {"colour": "green", "n": 5, "f": 2.5, "yes": True, "no": False, "s": "a_b%c", "empty": ""}


@pytest.mark.parametrize("selector, expected", [
    ("colour = 'green'", True), ("colour <> 'green'", False), ("'green' = colour", True),
    ("n = 5", True), ("n = 5.0", True), ("n > 4 AND f < 3", True), ("n >= 5 AND n <= 5", True),
    ("n < 5 OR f > 2", True), ("NOT n = 5", False), ("NOT (n = 5 AND f = 1)", True),
    ("n BETWEEN 1 AND 5", True), ("n BETWEEN 6 AND 9", False), ("n NOT BETWEEN 6 AND 9", True),
    ("f BETWEEN 2 AND 2.5", True), ("n + 1 BETWEEN 6 AND n * 2", True),
    ("colour IN ('red', 'green')", True), ("colour NOT IN ('red', 'blue')", True), ("n IN (5, 6)", True),
    ("colour LIKE 'gr%'", True), ("colour LIKE 'gr__n'", True), ("colour LIKE 'gr_n'", False),
    ("colour NOT LIKE '%ee%'", False), ("s LIKE 'a\\_b\\%c' ESCAPE '\\'", True), ("s LIKE 'a!_b%' ESCAPE '!'", True),
    ("s LIKE 'a!_b!%' ESCAPE '!'", False), ("colour LIKE '.*'", False), ("empty LIKE '%'", True),
    ("missing IS NULL", True), ("colour IS NOT NULL", True), ("colour IS NULL", False),
    ("yes", True), ("no", False), ("NOT no", True), ("yes = TRUE", True), ("yes AND NOT no", True),
    ("n / 2 = 2", True), ("-n / 2 = -2", True), ("f / 2 = 1.25", True), ("n * 1.0 / 2 = 2.5", True),
    ("-n = -5", True), ("+n = 5", True), ("- -n = 5", True), ("n - -1 = 6", True), ("2 + 3 * 2 = 8", True),
    ("(2 + 3) * 2 = 10", True), ("0x10 = 16", True), ("010 = 8", True), ("7L = 7", True), ("1e1 = 10", True),
    ("1.5E-1 = .15", True), ("2d = 2", True),
    ("colour = 'it''s'", False), ("colour > 'a'", True), ("colour < 'a'", False),
    ("n = '5'", False), ("n <> '5'", False), ("yes = 1", False), ("yes > FALSE", False), ("colour = 5", False),
    ("n / 0 = 1", False), ("n / 0 IS NULL", True), ("f / 0 > 1000", True),
    ("\"colour\" = 'green'", True), ("and_not = 1 or n = 5", True), ("Colour = 'green'", False),
    ("colour = 'green' and n = 5", True), ("colour LIKE 'green' escape '!'", True),
])
def test_selector_cases(selector, expected):
    assert matches(selector, properties=PROPS, body="x") is expected, selector


@pytest.mark.parametrize("selector, expected", [
    # JMS three-valued logic: NULL (an absent property) makes a comparison UNKNOWN, and only TRUE matches
    ("missing = 1", False), ("missing <> 1", False), ("NOT missing = 1", False), ("NOT missing <> 1", False),
    ("missing = 1 AND n = 5", False), ("missing = 1 OR n = 5", True), ("missing = 1 OR n = 6", False),
    ("NOT (missing = 1 OR n = 6)", False), ("NOT (missing = 1 AND n = 6)", True),
    ("missing BETWEEN 1 AND 2", False), ("missing NOT BETWEEN 1 AND 2", False), ("n BETWEEN missing AND 9", False),
    ("n NOT BETWEEN missing AND 4", True),  # n > 4 already makes NOT BETWEEN true
    ("missing IN ('a')", False), ("missing NOT IN ('a')", False), ("missing LIKE 'a'", False),
    ("missing NOT LIKE 'a'", False), ("n LIKE '5'", False), ("n NOT LIKE '5'", False),
    ("missing + 1 IS NULL", True), ("missing", False), ("NOT missing", False), ("colour", False),
    ("NOT colour", False), ("colour AND yes", False), ("colour OR yes", True),
])
def test_three_valued_logic(selector, expected):
    assert matches(selector, properties=PROPS, body="x") is expected, selector


@pytest.mark.parametrize("selector, error", [
    ("", "empty selector at position 0"), ("   ", "empty selector at position 0"),
    ("colour = ", "unexpected the end of the selector at position 9"),
    ("colour == 'x'", "unexpected '=' at position 8"), ("a != 1", "unexpected character '!' at position 2"),
    ("a = 'open", "unterminated string literal at position 4"),
    ("\"a = 1", "unterminated quoted identifier at position 0"),
    ("'x'", "expected a condition, found a string at position 0"),
    ("1 + 2", "expected a condition, found a number at position 0"),
    ("a = 1 AND 5", "expected a condition, found a number at position 10"),
    ("NOT 'x'", "expected a condition, found a string at position 4"),
    ("5 + 'a' = 1", "expected a number, found a string at position 4"),
    ("a BETWEEN 'x' AND 2", "expected a number, found a string at position 10"),
    ("TRUE + 1 = 2", "expected a number, found a boolean at position 0"),
    ("a LIKE 5", "expected a string literal pattern after LIKE, found '5' at position 7"),
    ("5 LIKE 'x'", "LIKE needs a string, found a number at position 0"),
    ("a LIKE 'x' ESCAPE 'ab'", "the ESCAPE character must be a single character at position 18"),
    ("a LIKE 'x!' ESCAPE '!'", "the pattern ends with its escape character at position 7"),
    ("a NOT b", "expected BETWEEN, IN or LIKE after NOT, found 'b' at position 6"),
    ("a IS 5", "expected NULL, found '5' at position 5"),
    ("a IN ()", "expected a literal, found ')' at position 6"), ("a IN ('x'", "expected ')' closing the IN list"),
    ("a IN (b)", "expected a literal, found 'b' at position 6"), ("(a = 1", "expected ')', found the end"),
    ("a = 1 b", "unexpected 'b' at position 6"), ("a = b = c", "unexpected '=' at position 6"),
    ("09 = 1", "invalid octal literal 09 at position 0"), ("a = 1 AND", "unexpected the end of the selector"),
    ("AND = 1", "unexpected 'AND' at position 0"), ("a = NULL", "unexpected 'NULL' at position 4"),
    ("(" * 70 + "a = 1" + ")" * 70, "nested deeper than 64"),
])
def test_invalid_selectors_name_the_error_and_where(selector, error):
    with pytest.raises(SelectorError) as e:
        compile_selector(selector)
    assert error in str(e.value), str(e.value)


def test_long_chains_do_not_recurse():
    selector = " OR ".join(f"n = {i}" for i in range(1000))
    assert matches(selector, properties={"n": 999}, body="x")
    assert not matches(selector, properties={"n": 1000}, body="x")
    assert matches("n IN (" + ", ".join(str(i) for i in range(2000)) + ")", properties={"n": 1234}, body="x")


def test_application_property_types():
    props = {"byte": amqp_byte(-3), "short": short(-300), "int": int32(-70000), "long": -2 ** 40,
             "ulong": ulong(2 ** 63), "float": 0.5, "char": char("é"), "ts": timestamp(1700000000123),
             "uuid": uuid.UUID(int=7), "sym": symbol("s"), "bin": b"\x00\x01", "list": [1, 2], "null": None,
             "text": "héllo"}
    fields = MessageFields(encoded(properties=props, body="x"))
    assert [fields.application(k) for k in props] == [
        -3, -300, -70000, -2 ** 40, 2 ** 63, 0.5, "é", 1700000000123, "00000000-0000-0000-0000-000000000007", "s",
        None, None, None, "héllo"]
    assert matches("ts > 1700000000000 AND byte < 0 AND ulong > 0 AND char = 'é'", properties=props, body="x")


def test_header_and_properties_identifiers():
    message = dict(durable=True, priority=7, ttl=2.0, delivery_count=2, id=uuid.UUID(int=1), user_id=b"alice",
                   address="to.q", subject="subj", reply_to="r", correlation_id=ulong(42), content_type="text/plain",
                   creation_time=1700000000.5, expiry_time=1700000100.25, group_id="g", group_sequence=3,
                   reply_to_group_id="rg", body="x")
    values = {"JMSDeliveryMode": "PERSISTENT", "JMSPriority": 7, "JMSMessageID": "00000000-0000-0000-0000-000000000001",
              "JMSTimestamp": 1700000000500, "JMSCorrelationID": "42", "JMSType": "subj",
              "JMSExpiration": 1700000100250, "JMSRedelivered": True, "JMSXDeliveryCount": 3, "JMSXGroupID": "g",
              "JMSXGroupSeq": 3, "JMSXUserID": "alice", "amqp.durable": True, "amqp.ttl": 2000,
              "amqp.delivery_count": 2, "amqp.to": "to.q", "amqp.reply_to": "r", "amqp.content_type": "text/plain",
              "amqp.reply_to_group_id": "rg", "amqp.first_acquirer": False, "amqp.delivery_mode": "PERSISTENT",
              "amqp.redelivered": True, "amqp.unknown": None, "JMSUnknown": None}
    for name, value in values.items():
        if value is None:
            assert matches(f"{name} IS NULL", **message), name
        elif isinstance(value, str):
            assert matches(f"{name} = '{value}'", **message), name
        else:
            assert matches(f"{name} = {str(value).upper()}", **message), name
    # absent sections: AMQP's defaults for the header, NULL for the properties
    bare = dict(body="x")
    assert matches("JMSPriority = 4 AND JMSDeliveryMode = 'NON_PERSISTENT' AND NOT JMSRedelivered", **bare)
    assert matches("JMSXDeliveryCount = 1 AND JMSMessageID IS NULL AND JMSType IS NULL", **bare)
    assert matches("JMSMessageID = 'ID:x'", id="ID:x", body="x")


def test_a_malformed_message_matches_nothing_but_is_null():
    fields = MessageFields(b"\x00\x53\x74\xc1\xff\x05")  # application-properties cut short
    assert not compile_selector("a = 1").matches(fields)
    assert compile_selector("a IS NULL").matches(fields)
    assert not compile_selector("a = 1").matches(MessageFields(b"junk"))


# -- dispatch ------------------------------------------------------------------------------------
class Sub:
    """A consumer or browser as the queue sees one: takes up to `credit`; settles nothing unless asked."""

    def __init__(self, queue: Queue, credit: int = 0, selector: str | None = None, browse: bool = False,
                 presettled: bool = False):
        self.queue = queue
        self.browse = browse
        self.cursor = 0
        self.selector = compile_selector(selector) if selector else None
        self.returned = []
        self._credit = credit
        self.presettled = presettled
        self.got = []
        self.dry = 0
        queue.subscribe(self)

    def credit(self) -> int:
        return self._credit

    def grant(self, n: int) -> None:
        self._credit += n

    def deliver(self, entry) -> None:
        self._credit -= 1
        self.got.append(entry)
        if self.presettled:
            self.queue.dequeue(entry)

    def after_dispatch(self) -> None:
        self.dry += 1

    def queue_deleted(self) -> None:
        pass

    def bodies(self) -> list:
        return [body(e.data) for e in self.got]


def body(data: bytes):
    m = Message()
    m.decode(data)
    return m.body


def make_queue() -> tuple[Queue, list]:
    scheduled: list = []
    return Queue("q", {}, "uid", scheduled.append), scheduled


def fill(queue: Queue, colours: str) -> None:
    names = {"r": "red", "g": "green", "b": "blue"}
    for i, c in enumerate(colours):
        queue.enqueue(encoded(body=f"{names[c]}-{i}", properties={"colour": names[c]}), 0.0)


def test_selector_consumer_takes_its_matches_and_leaves_the_rest_in_order():
    q, _ = make_queue()
    fill(q, "rgbggrbgr")
    greens = Sub(q, 10, "colour = 'green'")
    q.dispatch()
    assert greens.bodies() == ["green-1", "green-3", "green-4", "green-7"]
    assert greens.dry == 1  # found nothing more: a drain would be answered
    anyone = Sub(q, 10)
    q.dispatch()
    assert anyone.bodies() == ["red-0", "blue-2", "red-5", "blue-6", "red-8"]
    fill(q, "g")
    q.dispatch()
    assert greens.bodies()[-1] == "green-0" and len(anyone.got) == 5


def test_a_released_message_comes_back_to_whoever_may_take_it_in_order():
    q, _ = make_queue()
    fill(q, "gggrrr")
    greens = Sub(q, 2, "colour = 'green'")
    q.dispatch()
    first, second = greens.got
    q.release(second)
    q.release(first, failed=True)
    greens.grant(3)
    q.dispatch()
    assert greens.bodies()[2:] == ["green-0", "green-1", "green-2"]
    reds = Sub(q, 3, "colour = 'red' AND JMSRedelivered")
    plain = Sub(q, 10)
    q.dispatch()
    assert reds.got == [] and plain.bodies() == ["red-3", "red-4", "red-5"]
    q.release(plain.got[0], failed=True)  # behind both cursors: to each heap, taken once
    q.dispatch()
    assert reds.bodies() == ["red-3"] and len(plain.got) == 3


def test_releases_back_and_forth_between_plain_and_selector_consumers():
    """An entry may sit in a heap of released entries while taken and released again (by a selector
    consumer that found it in its own heap), and a selector consumer's detach releases in plain mode."""
    q, _ = make_queue()
    fill(q, "rr")
    plain = Sub(q, 1)
    reds = Sub(q, 0, "colour = 'red'")
    q.dispatch()
    reds.grant(1)
    q.dispatch()  # reds scans past red-0 (plain holds it) and takes red-1
    assert plain.bodies() == ["red-0"] and reds.bodies() == ["red-1"]
    q.release(plain.got[0])  # behind both cursors
    reds.grant(1)
    q.dispatch()
    assert reds.bodies() == ["red-1", "red-0"]
    q.release(reds.got[1])  # again: a second item for it on the queue's heap
    q.unsubscribe(reds)
    q.release(reds.got[0], failed=True)  # as a detach does: after unsubscribing
    plain.grant(5)
    q.dispatch()
    assert plain.bodies() == ["red-0", "red-0", "red-1"]


def test_a_release_after_the_selector_consumers_left_goes_back_to_its_place():
    """What a selector consumer took lies ahead of the shared cursor: released once it has gone (a detach
    unsubscribes, then releases), it is found in place, not handed out before older messages."""
    q, _ = make_queue()
    fill(q, "rrrg")
    greens = Sub(q, 1, "colour = 'green'")
    q.dispatch()
    q.unsubscribe(greens)
    q.release(greens.got[0], failed=True)
    plain = Sub(q, 10)
    q.dispatch()
    assert plain.bodies() == ["red-0", "red-1", "red-2", "green-3"]


def test_a_head_no_one_matches_is_scanned_once_and_in_bounded_passes():
    """Each selector consumer looks at each message once; a pass looks at SCAN_BUDGET at most (what it
    spent shows in the queue's budget) and asks for the next; a new message then costs one look, not a
    scan from the head again."""
    q, scheduled = make_queue()
    n = 3 * SCAN_BUDGET + 10
    for i in range(n):
        q.enqueue(encoded(body=i, properties={"k": i}), 0.0)
    c = Sub(q, 1, f"k = {n}")
    looks = []
    scheduled.clear()
    while True:
        q.dispatch()
        looks.append(SCAN_BUDGET - q._budget)
        if not scheduled:
            break
        scheduled.clear()
    assert looks == [SCAN_BUDGET] * 3 + [10] and c.got == [] and c.dry == 1
    q.enqueue(encoded(body="it", properties={"k": n}), 0.0)
    q.dispatch()
    assert SCAN_BUDGET - q._budget == 1 and [body(e.data) for e in c.got] == ["it"]
    plain = Sub(q, 1)  # a consumer without a selector takes the head at once
    q.dispatch()
    assert body(plain.got[0].data) == 0


def test_one_decode_per_message_per_pass_for_all_selectors():
    q, _ = make_queue()
    fill(q, "rgbrgb")
    views: dict = {}
    entry = q.entries()[0]
    assert queue_module._fields(views, entry) is queue_module._fields(views, entry)  # what dispatch shares
    subs = [Sub(q, 10, "colour = 'blue'"), Sub(q, 10, "colour = 'blue' OR colour = 'green'"),
            Sub(q, 10, "colour <> 'red'", browse=True)]
    q.dispatch()
    assert [s.bodies() for s in subs] == [["blue-2", "blue-5"], ["green-1", "green-4"],
                                          ["green-1", "blue-2", "green-4", "blue-5"]]


def test_a_queue_without_selectors_looks_at_nothing():
    q, _ = make_queue()
    fill(q, "rgb")
    consumer, browser = Sub(q, 10), Sub(q, 10, browse=True)
    q.dispatch()
    assert len(consumer.got) == 3 and len(browser.got) == 3 and q._budget == SCAN_BUDGET


def test_selector_browser():
    q, _ = make_queue()
    fill(q, "rgbg")
    browser = Sub(q, 10, "colour = 'green'", browse=True)
    q.dispatch()
    assert browser.bodies() == ["green-1", "green-3"] and browser.dry == 1
    assert all(e.state == AVAILABLE for e in q.entries()) and q.depth == 4


def test_an_own_subscription_drops_what_its_selector_skips():
    q, _ = make_queue()
    q.discard_unmatched = True
    fill(q, "rgbg")
    c = Sub(q, 10, "colour = 'green'")
    q.dispatch()
    assert c.bodies() == ["green-1", "green-3"] and q.depth == 2


def test_an_expiry_that_compacts_the_log_mid_scan_skips_nothing():
    """A scan that meets an expired message dequeues it, and a dequeue may drop the log's dequeued prefix
    (in batches of 1024): the scan goes on from the same message, for plain and selector consumers alike."""
    for selector in (None, "colour = 'red'"):
        q, _ = make_queue()
        fill(q, "r" * 1023)
        q.enqueue(encoded(body="old", properties={"colour": "red"}), time.monotonic() - 1)
        for i in range(5):
            q.enqueue(encoded(body=f"new-{i}", properties={"colour": "red"}), 0.0)
        c = Sub(q, 1023, selector, presettled=True)
        q.dispatch()  # takes (and dequeues) the first 1023: the log's dequeued prefix is 1023 long
        assert q.depth == 6 and len(c.got) == 1023
        c.grant(10)
        q.dispatch()  # the expired one's dequeue drops the prefix (this raised IndexError)
        assert [body(e.data) for e in c.got[1023:]] == [f"new-{i}" for i in range(5)], selector
        assert q.depth == 0
