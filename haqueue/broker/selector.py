"""Message selectors: the JMS (SQL-92 subset) filter a receiving link may give in its source
(`apache.org:selector-filter:string`), compiled once at attach, evaluated per message.

    compile_selector(text) -> Selector      raises SelectorError (a message and a position)
    Selector.matches(MessageFields) -> bool  only TRUE matches: FALSE and UNKNOWN do not
    MessageFields(data)                      a message's header, properties and application
                                             properties, each decoded on first use

The grammar, the identifiers (application properties, the JMS header names, `amqp.` names for the
header and properties fields), the three-valued logic and what dispatch costs: design/selectors.md.
The broker keeps messages as their encoded bytes; only a link with a selector decodes anything, and a
queue decodes a message once per dispatch pass however many selector consumers look at it.
"""
from __future__ import annotations

import math
import re
import struct
import uuid
from typing import Any, Callable, Final

from .message import APPLICATION_PROPERTIES, HEADER, PROPERTIES, MalformedMessage, read, sections, skip
from .message import _compound as compound

# The filter's descriptor, as proton's Selector (symbolic) or rhea's filter.selector (numeric) gives it.
SELECTOR_DESCRIPTORS: Final = ("apache.org:selector-filter:string", 0x0000468C00000004)

MAX_LENGTH: Final = 16384  # characters of selector text
MAX_DEPTH: Final = 64  # nesting of the expression (parentheses, NOT, arithmetic): evaluation recurses that deep

Value = Any  # None (NULL, or UNKNOWN as a truth value), bool, int, float or str
Fn = Callable[["MessageFields"], Value]


class SelectorError(ValueError):
    """An invalid selector: what is wrong, and where (a 0-based character offset)."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at position {position}")
        self.message = message
        self.position = position


# -- a message's fields -----------------------------------------------------------------------
_U32: Final = struct.Struct(">I")

_HEADER_FIELDS: Final = ("durable", "priority", "ttl", "first_acquirer", "delivery_count")
_HEADER_DEFAULTS: tuple[Value, ...] = (False, 4, None, False, 0)  # AMQP's defaults for an absent field
_PROPERTY_FIELDS: Final = ("message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
                    "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
                    "reply_to_group_id")
_NO_FIELDS: tuple[Value, ...] = ()
_NO_PROPERTIES: dict[str, Value] = {}


def _value(data: bytes, pos: int) -> Value:
    """The encoded value at pos as a selector sees it: what message.read gives for booleans, numbers
    (timestamps in ms), strings, symbols and chars; a uuid as its canonical text; anything else (binary,
    decimals, lists, maps, arrays, described values) as NULL."""
    code = data[pos]
    if code == 0x98:
        return str(uuid.UUID(bytes=bytes(data[pos + 1:pos + 17])))
    if code == 0xA0 or code == 0xB0 or code == 0xC1 or code == 0xD1:
        return None
    value: Value = read(data, pos)
    return value


def _utf8(data: bytes, pos: int) -> Value:
    """A binary field read as UTF-8 text (the properties' user-id), NULL if it is not."""
    code = data[pos]
    if code == 0xA0:
        raw = bytes(data[pos + 2:pos + 2 + data[pos + 1]])
    elif code == 0xB0:
        raw = bytes(data[pos + 5:pos + 5 + _U32.unpack_from(data, pos + 1)[0]])
    else:
        return _value(data, pos)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _id_text(data: bytes, pos: int) -> Value:
    """A message-id or correlation-id as text: a string as is, a ulong in decimal, a uuid in canonical
    form; a binary id is NULL."""
    value = _value(data, pos)
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _fields(data: bytes, pos: int, count: int, readers: dict[int, Callable[[bytes, int], Value]]) -> list[Value]:
    """The first `count` fields of the list at pos (None where absent or null)."""
    n, p = compound(data, pos)
    out: list[Value] = []
    for i in range(min(n, count)):
        reader = readers.get(i)
        out.append(reader(data, p) if reader is not None else _value(data, p))
        p = skip(data, p)
    out.extend([None] * (count - len(out)))
    return out


_PROPERTY_READERS: dict[int, Callable[[bytes, int], Value]] = {0: _id_text, 1: _utf8, 5: _id_text}
_NO_READERS: dict[int, Callable[[bytes, int], Value]] = {}


class MessageFields:
    """What a selector reads of one message, each section decoded on first use and kept."""

    __slots__ = ("data", "_sections", "_header", "_properties", "_application")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._sections: dict[int, int] | None = None
        self._header: list[Value] | None = None
        self._properties: list[Value] | None = None
        self._application: dict[str, Value] | None = None

    def _where(self) -> dict[int, int]:
        found = self._sections
        if found is None:
            try:
                found = sections(self.data)
            except (MalformedMessage, IndexError, struct.error):
                found = {}
            self._sections = found
        return found

    def header(self, index: int) -> Value:
        header = self._header
        if header is None:
            pos = self._where().get(HEADER)
            header = self._header = self._list(pos, len(_HEADER_FIELDS), _NO_READERS)
        value = header[index] if index < len(header) else None
        return _HEADER_DEFAULTS[index] if value is None else value

    def property(self, index: int) -> Value:
        properties = self._properties
        if properties is None:
            pos = self._where().get(PROPERTIES)
            properties = self._properties = self._list(pos, len(_PROPERTY_FIELDS), _PROPERTY_READERS)
        return properties[index] if index < len(properties) else None

    def application(self, name: str) -> Value:
        application = self._application
        if application is None:
            application = self._application = self._map(self._where().get(APPLICATION_PROPERTIES))
        return application.get(name)

    def _list(self, pos: int | None, count: int, readers: dict[int, Callable[[bytes, int], Value]]) -> list[Value]:
        if pos is None:
            return []
        try:
            return _fields(self.data, pos, count, readers)
        except (MalformedMessage, IndexError, struct.error, UnicodeDecodeError, ValueError):
            return []

    def _map(self, pos: int | None) -> dict[str, Value]:
        if pos is None:
            return _NO_PROPERTIES
        data = self.data
        out: dict[str, Value] = {}
        try:
            n, p = compound(data, pos)
            for _ in range(n // 2):
                key = _value(data, p)
                p = skip(data, p)
                if isinstance(key, str):
                    out[key] = _value(data, p)
                p = skip(data, p)
        except (MalformedMessage, IndexError, struct.error, UnicodeDecodeError, ValueError):
            pass  # what was read before the damage stays
        return out


# -- identifiers ------------------------------------------------------------------------------
def _header(index: int) -> Fn:
    return lambda m: m.header(index)


def _property(index: int) -> Fn:
    return lambda m: m.property(index)


def _application(name: str) -> Fn:
    return lambda m: m.application(name)


_H: Final = {name: i for i, name in enumerate(_HEADER_FIELDS)}
_P: Final = {name: i for i, name in enumerate(_PROPERTY_FIELDS)}


def _delivery_mode(m: MessageFields) -> Value:
    return "PERSISTENT" if m.header(_H["durable"]) else "NON_PERSISTENT"


def _redelivered(m: MessageFields) -> Value:
    return m.header(_H["delivery_count"]) > 0


def _jmsx_delivery_count(m: MessageFields) -> Value:
    return m.header(_H["delivery_count"]) + 1


# The JMS names of header fields, as Qpid C++ and ActiveMQ Artemis map them for AMQP 1.0 messages
# (design/selectors.md), and JMSX properties the AMQP JMS mapping carries in the properties section.
_JMS: dict[str, Fn] = {
    "JMSDeliveryMode": _delivery_mode,
    "JMSPriority": _header(_H["priority"]),
    "JMSMessageID": _property(_P["message_id"]),
    "JMSTimestamp": _property(_P["creation_time"]),
    "JMSCorrelationID": _property(_P["correlation_id"]),
    "JMSType": _property(_P["subject"]),
    "JMSExpiration": _property(_P["absolute_expiry_time"]),
    "JMSRedelivered": _redelivered,
    "JMSXDeliveryCount": _jmsx_delivery_count,
    "JMSXGroupID": _property(_P["group_id"]),
    "JMSXGroupSeq": _property(_P["group_sequence"]),
    "JMSXUserID": _property(_P["user_id"]),
}
# Qpid C++'s `amqp.` prefix: every header and properties field by its AMQP name (underscores for
# hyphens), and its two computed values.
_AMQP: dict[str, Fn] = {**{name: _header(i) for i, name in enumerate(_HEADER_FIELDS)},
                        **{name: _property(i) for i, name in enumerate(_PROPERTY_FIELDS)},
                        "delivery_mode": _delivery_mode, "redelivered": _redelivered}


def _identifier(name: str) -> Fn:
    special = _JMS.get(name)
    if special is not None:
        return special
    if name.startswith("amqp."):
        special = _AMQP.get(name[5:])
        if special is not None:
            return special
    return _application(name)


# -- three-valued logic and comparison ---------------------------------------------------------
def _truth(value: Value) -> Value:
    """A value as a truth value: TRUE, FALSE, or None (UNKNOWN) for NULL and anything not boolean."""
    return value if value is True or value is False else None


def _number(value: Value) -> bool:
    return (type(value) is int or type(value) is float)


_EQ: Final = "="
_NE: Final = "<>"
_LT: Final = "<"
_LE: Final = "<="
_GT: Final = ">"
_GE: Final = ">="


def _compare(op: str, a: Value, b: Value) -> Value:
    """JMS comparison: UNKNOWN if either side is NULL; numbers compare by value (an int with a float);
    strings compare for equality, and (as ActiveMQ and Artemis allow) in code point order; booleans only
    for equality; values of unlike types are never equal nor ordered (FALSE)."""
    if a is None or b is None:
        return None
    ta, tb = type(a), type(b)
    if ta is not tb and not (_number(a) and _number(b)):
        return False
    if op == _EQ:
        return bool(a == b)
    if op == _NE:
        return bool(a != b)
    if ta is bool:
        return False
    if op == _LT:
        return bool(a < b)
    if op == _LE:
        return bool(a <= b)
    if op == _GT:
        return bool(a > b)
    return bool(a >= b)


def _arithmetic(op: str, a: Value, b: Value) -> Value:
    """+ - * / on numbers (Java's promotion: int op int is an int, / truncates; int / 0 is NULL, as Java
    would raise); NULL if either side is NULL or not a number."""
    if not (_number(a) and _number(b)):
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if type(a) is int and type(b) is int:
        if b == 0:
            return None
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q
    if b == 0:
        return math.nan if a == 0 or a != a else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


# -- the compiled expression: closures over MessageFields ---------------------------------------
def _const(value: Value) -> Fn:
    return lambda m: value


def _and(parts: list[Fn]) -> Fn:
    def evaluate(m: MessageFields) -> Value:
        result: Value = True
        for part in parts:
            value = _truth(part(m))
            if value is False:
                return False
            if value is None:
                result = None
        return result
    return evaluate


def _or(parts: list[Fn]) -> Fn:
    def evaluate(m: MessageFields) -> Value:
        result: Value = False
        for part in parts:
            value = _truth(part(m))
            if value is True:
                return True
            if value is None:
                result = None
        return result
    return evaluate


def _not(operand: Fn) -> Fn:
    def evaluate(m: MessageFields) -> Value:
        value = _truth(operand(m))
        return None if value is None else not value
    return evaluate


def _comparison(op: str, left: Fn, right: Fn) -> Fn:
    return lambda m: _compare(op, left(m), right(m))


def _binary(op: str, left: Fn, right: Fn) -> Fn:
    return lambda m: _arithmetic(op, left(m), right(m))


def _negate(operand: Fn) -> Fn:
    def evaluate(m: MessageFields) -> Value:
        value = operand(m)
        return -value if _number(value) else None
    return evaluate


def _plus(operand: Fn) -> Fn:
    def evaluate(m: MessageFields) -> Value:
        value = operand(m)
        return value if _number(value) else None
    return evaluate


def _between(operand: Fn, low: Fn, high: Fn, negated: bool) -> Fn:
    def evaluate(m: MessageFields) -> Value:
        value = operand(m)
        a = _compare(_GE, value, low(m))
        if a is False:
            return negated
        b = _compare(_LE, value, high(m))
        if b is False:
            return negated
        if a is None or b is None:
            return None
        return not negated
    return evaluate


def _in(operand: Fn, values: list[Value], negated: bool) -> Fn:
    def evaluate(m: MessageFields) -> Value:
        value = operand(m)
        if value is None:
            return None
        for candidate in values:
            if _compare(_EQ, value, candidate):
                return not negated
        return negated
    return evaluate


def _like(operand: Fn, pattern: "re.Pattern[str]", negated: bool) -> Fn:
    def evaluate(m: MessageFields) -> Value:
        value = operand(m)
        if value is None:
            return None
        if type(value) is not str:
            return False
        return (pattern.fullmatch(value) is None) == negated
    return evaluate


def _is_null(operand: Fn, negated: bool) -> Fn:
    return lambda m: (operand(m) is None) != negated


def like_pattern(pattern: str, escape: str | None) -> "re.Pattern[str]":
    """A LIKE pattern as a regular expression: `_` one character, `%` any run, the escape character
    before either (or itself) for the character itself."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape:
            if i + 1 >= len(pattern):
                raise ValueError("the pattern ends with its escape character")
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


# -- the parser ---------------------------------------------------------------------------------
_KEYWORDS: Final = {"AND", "OR", "NOT", "BETWEEN", "LIKE", "IN", "IS", "NULL", "ESCAPE", "TRUE", "FALSE"}
_TOKEN: Final = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>'(?:[^']|'')*')
  | (?P<quoted>"(?:[^"]|"")*")
  | (?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?|\d+[eE][+-]?\d+[fFdD]?|\d+[fFdD])
  | (?P<hex>0[xX][0-9a-fA-F]+[lL]?)
  | (?P<integer>\d+[lL]?)
  | (?P<word>(?:[^\W\d]|\$)[\w$.]*)
  | (?P<op><>|<=|>=|[=<>+\-*/(),])
""", re.VERBOSE)

# Token kinds beside the operators themselves (kept as their text) and keywords (upper case).
_STRING: Final = "string"
_IDENT: Final = "identifier"
_NUMBER: Final = "number"
_END: Final = "end"
# Static kinds of expressions, to refuse at attach what can never be a condition or a number.
_BOOL: Final = "a boolean"
_NUM: Final = "a number"
_STR: Final = "a string"
_ANY: Final = "any"


class _Token:
    __slots__ = ("kind", "value", "position", "text")

    def __init__(self, kind: str, value: Value, position: int, text: str) -> None:
        self.kind = kind
        self.value = value
        self.position = position
        self.text = text


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            if text[pos] == "'":
                raise SelectorError("unterminated string literal", pos)
            if text[pos] == '"':
                raise SelectorError("unterminated quoted identifier", pos)
            raise SelectorError(f"unexpected character {text[pos]!r}", pos)
        kind = match.lastgroup
        raw = match.group()
        if kind == "string":
            out.append(_Token(_STRING, raw[1:-1].replace("''", "'"), pos, raw))
        elif kind == "quoted":
            out.append(_Token(_IDENT, raw[1:-1].replace('""', '"'), pos, raw))
        elif kind == "float":
            out.append(_Token(_NUMBER, float(raw.rstrip("fFdD")), pos, raw))
        elif kind == "hex":
            out.append(_Token(_NUMBER, int(raw.rstrip("lL")[2:], 16), pos, raw))
        elif kind == "integer":
            digits = raw.rstrip("lL")
            if len(digits) > 1 and digits[0] == "0":  # Java's octal literal
                if not all(c in "01234567" for c in digits):
                    raise SelectorError(f"invalid octal literal {raw}", pos)
                out.append(_Token(_NUMBER, int(digits, 8), pos, raw))
            else:
                out.append(_Token(_NUMBER, int(digits), pos, raw))
        elif kind == "word":
            upper = raw.upper()
            out.append(_Token(upper, None, pos, raw) if upper in _KEYWORDS else _Token(_IDENT, raw, pos, raw))
        elif kind == "op":
            out.append(_Token(raw, None, pos, raw))
        pos = match.end()
    out.append(_Token(_END, None, len(text), ""))
    return out


def _found(token: _Token) -> str:
    return "the end of the selector" if token.kind == _END else repr(token.text)


class _Parser:
    """Recursive descent over the JMS selector grammar (precedence, lowest first: OR, AND, NOT,
    comparison/BETWEEN/IN/LIKE/IS, + -, * /, unary + -)."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.i = 0
        self.depth = 0

    @property
    def token(self) -> _Token:
        return self.tokens[self.i]

    def take(self, kind: str) -> bool:
        if self.tokens[self.i].kind == kind:
            self.i += 1
            return True
        return False

    def expect(self, kind: str, what: str) -> _Token:
        token = self.tokens[self.i]
        if token.kind != kind:
            raise SelectorError(f"expected {what}, found {_found(token)}", token.position)
        self.i += 1
        return token

    def enter(self, position: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SelectorError(f"expression nested deeper than {MAX_DEPTH}", position)

    def selector(self) -> Fn:
        position = self.token.position
        fn, kind = self.or_()
        if self.token.kind != _END:
            raise SelectorError(f"unexpected {_found(self.token)}", self.token.position)
        self.condition(kind, position)
        return fn

    def condition(self, kind: str, position: int) -> None:
        if kind != _BOOL and kind != _ANY:
            raise SelectorError(f"expected a condition, found {kind}", position)

    def or_(self) -> tuple[Fn, str]:
        position = self.token.position
        fn, kind = self.and_()
        if self.token.kind != "OR":
            return fn, kind
        self.condition(kind, position)
        parts = [fn]
        while self.take("OR"):
            position = self.token.position
            fn, kind = self.and_()
            self.condition(kind, position)
            parts.append(fn)
        return _or(parts), _BOOL

    def and_(self) -> tuple[Fn, str]:
        position = self.token.position
        fn, kind = self.not_()
        if self.token.kind != "AND":
            return fn, kind
        self.condition(kind, position)
        parts = [fn]
        while self.take("AND"):
            position = self.token.position
            fn, kind = self.not_()
            self.condition(kind, position)
            parts.append(fn)
        return _and(parts), _BOOL

    def not_(self) -> tuple[Fn, str]:
        if self.token.kind == "NOT":
            self.enter(self.token.position)
            self.i += 1
            position = self.token.position
            fn, kind = self.not_()
            self.condition(kind, position)
            self.depth -= 1
            return _not(fn), _BOOL
        return self.predicate()

    def predicate(self) -> tuple[Fn, str]:
        position = self.token.position
        left, kind = self.sum()
        token = self.token
        if token.kind in (_EQ, _NE, _LT, _LE, _GT, _GE):
            self.i += 1
            right, _ = self.sum()
            return _comparison(token.kind, left, right), _BOOL
        if token.kind == "IS":
            self.i += 1
            negated = self.take("NOT")
            self.expect("NULL", "NULL")
            return _is_null(left, negated), _BOOL
        negated = self.take("NOT")
        token = self.token
        if token.kind == "BETWEEN":
            self.i += 1
            self.arithmetic(kind, position)
            position = self.token.position
            low, low_kind = self.sum()
            self.arithmetic(low_kind, position)
            self.expect("AND", "AND")
            position = self.token.position
            high, high_kind = self.sum()
            self.arithmetic(high_kind, position)
            return _between(left, low, high, negated), _BOOL
        if token.kind == "IN":
            self.i += 1
            self.expect("(", "'(' after IN")
            values = [self.literal()]
            while self.take(","):
                values.append(self.literal())
            self.expect(")", "')' closing the IN list")
            return _in(left, values, negated), _BOOL
        if token.kind == "LIKE":
            self.i += 1
            if kind != _STR and kind != _ANY:
                raise SelectorError(f"LIKE needs a string, found {kind}", position)
            pattern = self.expect(_STRING, "a string literal pattern after LIKE")
            escape: str | None = None
            if self.take("ESCAPE"):
                escape_token = self.expect(_STRING, "a string literal after ESCAPE")
                escape = escape_token.value
                if escape is None or len(escape) != 1:
                    raise SelectorError("the ESCAPE character must be a single character", escape_token.position)
            try:
                compiled = like_pattern(pattern.value, escape)
            except ValueError as e:
                raise SelectorError(str(e), pattern.position) from None
            return _like(left, compiled, negated), _BOOL
        if negated:
            raise SelectorError(f"expected BETWEEN, IN or LIKE after NOT, found {_found(token)}", token.position)
        return left, kind

    def literal(self) -> Value:
        token = self.token
        sign = 1
        if token.kind in ("+", "-"):
            sign = -1 if token.kind == "-" else 1
            self.i += 1
            token = self.expect(_NUMBER, "a number")
            return sign * token.value
        if token.kind in (_STRING, _NUMBER):
            self.i += 1
            return token.value
        if token.kind in ("TRUE", "FALSE"):
            self.i += 1
            return token.kind == "TRUE"
        raise SelectorError(f"expected a literal, found {_found(token)}", token.position)

    def arithmetic(self, kind: str, position: int) -> None:
        if kind != _NUM and kind != _ANY:
            raise SelectorError(f"expected a number, found {kind}", position)

    def sum(self) -> tuple[Fn, str]:
        return self.arithmetic_level(("+", "-"), self.product)

    def product(self) -> tuple[Fn, str]:
        return self.arithmetic_level(("*", "/"), self.unary)

    def arithmetic_level(self, operators: tuple[str, str], operand: Callable[[], tuple[Fn, str]]) -> tuple[Fn, str]:
        """operand (op operand)*, left to right, for one precedence level of + - or * /."""
        position = self.token.position
        fn, kind = operand()
        depth = self.depth
        while self.token.kind in operators:
            op = self.token.kind
            self.arithmetic(kind, position)
            self.enter(self.token.position)
            self.i += 1
            position = self.token.position
            right, right_kind = operand()
            self.arithmetic(right_kind, position)
            fn, kind = _binary(op, fn, right), _NUM
        self.depth = depth
        return fn, kind

    def unary(self) -> tuple[Fn, str]:
        token = self.token
        if token.kind in ("+", "-"):
            self.i += 1
            if self.token.kind == _NUMBER:  # a signed literal, folded
                value = self.token.value
                self.i += 1
                return _const(-value if token.kind == "-" else value), _NUM
            self.enter(token.position)
            position = self.token.position
            fn, kind = self.unary()
            self.arithmetic(kind, position)
            self.depth -= 1
            return (_negate(fn) if token.kind == "-" else _plus(fn)), _NUM
        return self.primary()

    def primary(self) -> tuple[Fn, str]:
        token = self.token
        if token.kind == "(":
            self.enter(token.position)
            self.i += 1
            fn, kind = self.or_()
            self.expect(")", "')'")
            self.depth -= 1
            return fn, kind
        if token.kind == _STRING:
            self.i += 1
            return _const(token.value), _STR
        if token.kind == _NUMBER:
            self.i += 1
            return _const(token.value), _NUM
        if token.kind in ("TRUE", "FALSE"):
            self.i += 1
            return _const(token.kind == "TRUE"), _BOOL
        if token.kind == _IDENT:
            self.i += 1
            return _identifier(token.value), _ANY
        raise SelectorError(f"unexpected {_found(token)}", token.position)


class Selector:
    """A compiled selector: `matches` is TRUE only for messages the expression is TRUE for."""

    __slots__ = ("text", "_evaluate")

    def __init__(self, text: str, evaluate: Fn) -> None:
        self.text = text
        self._evaluate = evaluate

    def matches(self, fields: MessageFields) -> bool:
        try:
            return self._evaluate(fields) is True
        except (OverflowError, ValueError, TypeError):  # a float overflow; a value no comparison expected
            return False

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse and compile a selector; SelectorError names what is wrong and where."""
    if not isinstance(text, str):
        raise SelectorError("a selector must be a string", 0)
    if len(text) > MAX_LENGTH:
        raise SelectorError(f"selector longer than {MAX_LENGTH} characters", MAX_LENGTH)
    if not text.strip():
        raise SelectorError("empty selector", 0)
    return Selector(text, _Parser(text).selector())


def selector_filter(filters: dict[Any, Any]) -> tuple[Any, str] | None:
    """The selector among a source's filters: (its key, its text), or None. Each value is a described
    value (proton's `Described`, with `descriptor` and `value`); a filter is a selector by its descriptor,
    whatever its key. More than one selector is refused (SelectorError)."""
    found: tuple[Any, str] | None = None
    for key, described in filters.items():
        descriptor = getattr(described, "descriptor", None)
        if descriptor is None or descriptor not in SELECTOR_DESCRIPTORS:
            continue
        if found is not None:
            raise SelectorError("more than one selector filter", 0)
        text = getattr(described, "value", None)
        if not isinstance(text, str):
            raise SelectorError("the selector filter's value is not a string", 0)
        found = (key, text)
    return found
