"""A small CEL evaluator for DRA device selectors.

DeviceClasses and claim requests select devices with CEL expressions such as

    device.driver == "gpu.nvidia.com"
    device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"
    device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0
    device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))
    has(device.attributes["gpu.nvidia.com"].parentUUID)

This module implements the subset of CEL those selectors use: literals, lists, maps, member and
index access, `has()`, `! - * / % + < <= > >= == != in && || ?:`, the string methods
`startsWith endsWith contains matches size lowerAscii upperAscii`, `size()`, `int() string()
double()`, and Kubernetes' `quantity()` and `semver()` with `compareTo isGreaterThan isLessThan
asInteger`. `&&` and `||` absorb errors the way CEL does (`false && error` is false).

`compile_expr(text)` parses once (ValueError on a syntax error); `Program.evaluate(env)` returns
the value or raises `CelError`. `device_env(driver, device)` builds the `device` variable from a
ResourceSlice device entry, with attribute and capacity maps keyed by domain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache, total_ordering
from typing import Any


class CelError(Exception):
    """A runtime error while evaluating an expression (missing key, type mismatch)."""


# --------------------------------------------------------------------------------------------
# Kubernetes value types: quantity and semantic version
# --------------------------------------------------------------------------------------------

_BINARY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")


@total_ordering
@dataclass(frozen=True)
class Quantity:
    """A Kubernetes resource quantity (`40Gi`, `500m`, `1e3`), compared by value."""

    value: Decimal
    text: str

    @classmethod
    def parse(cls, text: str) -> Quantity:
        match = _QUANTITY.match(str(text).strip())
        if not match:
            raise CelError(f"invalid quantity {text!r}")
        number, suffix = match.group(1), match.group(2) or ""
        try:
            base = Decimal(number)
        except InvalidOperation as err:
            raise CelError(f"invalid quantity {text!r}") from err
        if suffix in _BINARY_SUFFIX:
            return cls(base * _BINARY_SUFFIX[suffix], text)
        if suffix[:1] in ("e", "E"):
            return cls(base * (Decimal(10) ** int(suffix[1:])), text)
        return cls(base * _DECIMAL_SUFFIX[suffix], text)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value < other.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


@total_ordering
@dataclass(frozen=True)
class SemVer:
    """A semantic version; pre-releases sort before their release."""

    major: int
    minor: int
    patch: int
    pre: str = ""

    @classmethod
    def parse(cls, text: str) -> SemVer:
        match = _SEMVER.match(str(text).strip())
        if not match:
            raise CelError(f"invalid semantic version {text!r}")
        return cls(int(match[1]), int(match[2]), int(match[3]), match[4] or "")

    def _key(self) -> tuple[int, int, int, int, str]:
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, self.pre)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, SemVer):
            return NotImplemented
        return self._key() < other._key()


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<float>\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<uint>\d+[uU])
  | (?P<int>0[xX][0-9a-fA-F]+|\d+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>&&|\|\||==|!=|<=|>=|[-+*/%!<>?:.,()\[\]{}])
    """,
    re.VERBOSE,
)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


@dataclass(frozen=True)
class _Tok:
    kind: str
    value: Any
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise ValueError(f"unexpected character {text[pos]!r} at {pos} in {text!r}")
        kind = match.lastgroup or ""
        raw = match.group()
        if kind == "float":
            tokens.append(_Tok("lit", float(raw), pos))
        elif kind == "uint":
            tokens.append(_Tok("lit", int(raw[:-1]), pos))
        elif kind == "int":
            tokens.append(_Tok("lit", int(raw, 0), pos))
        elif kind == "string":
            tokens.append(_Tok("lit", _unquote(raw), pos))
        elif kind == "ident":
            if raw in ("true", "false"):
                tokens.append(_Tok("lit", raw == "true", pos))
            elif raw == "null":
                tokens.append(_Tok("lit", None, pos))
            elif raw == "in":
                tokens.append(_Tok("op", "in", pos))
            else:
                tokens.append(_Tok("ident", raw, pos))
        elif kind == "op":
            tokens.append(_Tok("op", raw, pos))
        pos = match.end()
    tokens.append(_Tok("eof", None, pos))
    return tokens


# --------------------------------------------------------------------------------------------
# Parser (recursive descent over CEL's grammar) producing tuples
# --------------------------------------------------------------------------------------------

Node = tuple[Any, ...]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def accept(self, op: str) -> bool:
        tok = self.peek()
        if tok.kind == "op" and tok.value == op:
            self.i += 1
            return True
        return False

    def expect(self, op: str) -> None:
        if not self.accept(op):
            tok = self.peek()
            raise ValueError(f"expected {op!r} at {tok.pos} in {self.text!r}")

    def parse(self) -> Node:
        node = self.expr()
        if self.peek().kind != "eof":
            raise ValueError(f"unexpected {self.peek().value!r} at {self.peek().pos}")
        return node

    def expr(self) -> Node:
        cond = self.or_()
        if self.accept("?"):
            then = self.or_()
            self.expect(":")
            other = self.expr()
            return ("cond", cond, then, other)
        return cond

    def or_(self) -> Node:
        node = self.and_()
        while self.accept("||"):
            node = ("or", node, self.and_())
        return node

    def and_(self) -> Node:
        node = self.rel()
        while self.accept("&&"):
            node = ("and", node, self.rel())
        return node

    def rel(self) -> Node:
        node = self.add()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.value in ("<", "<=", ">", ">=", "==", "!=", "in"):
                self.take()
                node = ("bin", tok.value, node, self.add())
            else:
                return node

    def add(self) -> Node:
        node = self.mul()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.value in ("+", "-"):
                self.take()
                node = ("bin", tok.value, node, self.mul())
            else:
                return node

    def mul(self) -> Node:
        node = self.unary()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.value in ("*", "/", "%"):
                self.take()
                node = ("bin", tok.value, node, self.unary())
            else:
                return node

    def unary(self) -> Node:
        if self.accept("!"):
            return ("not", self.unary())
        if self.accept("-"):
            return ("neg", self.unary())
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.accept("."):
                name = self.take()
                if name.kind != "ident":
                    raise ValueError(f"expected a field name at {name.pos} in {self.text!r}")
                if self.accept("("):
                    node = ("method", node, name.value, self.args(")"))
                else:
                    node = ("select", node, name.value)
            elif self.accept("["):
                index = self.expr()
                self.expect("]")
                node = ("index", node, index)
            else:
                return node

    def args(self, close: str) -> list[Node]:
        items: list[Node] = []
        if self.accept(close):
            return items
        while True:
            items.append(self.expr())
            if self.accept(close):
                return items
            self.expect(",")
            if self.accept(close):  # trailing comma
                return items

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind == "lit":
            return ("lit", tok.value)
        if tok.kind == "ident":
            if self.accept("("):
                return ("call", tok.value, self.args(")"))
            return ("ident", tok.value)
        if tok.kind == "op" and tok.value == "(":
            node = self.expr()
            self.expect(")")
            return node
        if tok.kind == "op" and tok.value == "[":
            return ("list", self.args("]"))
        if tok.kind == "op" and tok.value == "{":
            entries: list[tuple[Node, Node]] = []
            if not self.accept("}"):
                while True:
                    key = self.expr()
                    self.expect(":")
                    entries.append((key, self.expr()))
                    if self.accept("}"):
                        break
                    self.expect(",")
                    if self.accept("}"):
                        break
            return ("map", entries)
        raise ValueError(f"unexpected {tok.value!r} at {tok.pos} in {self.text!r}")


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


class _DomainMap(dict[str, Any]):
    """`device.attributes` / `device.capacity`: an unknown domain is an empty map, not an error."""

    def __missing__(self, key: str) -> dict[str, Any]:
        return {}


def _truthy(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelError(f"expected a bool, got {type(value).__name__}")
    return value


def _compare(op: str, left: Any, right: Any) -> bool:
    numeric = (int, float, Decimal)
    same = type(left) is type(right) or (
        isinstance(left, numeric)
        and isinstance(right, numeric)
        and not isinstance(left, bool)
        and not isinstance(right, bool)
    )
    if op == "==":
        return same and left == right
    if op == "!=":
        return not (same and left == right)
    if not same:
        raise CelError(f"no such overload: {type(left).__name__} {op} {type(right).__name__}")
    try:
        if op == "<":
            return bool(left < right)
        if op == "<=":
            return bool(left <= right)
        if op == ">":
            return bool(left > right)
        return bool(left >= right)
    except TypeError as err:
        raise CelError(str(err)) from err


def _arith(op: str, left: Any, right: Any) -> Any:
    if op == "+" and isinstance(left, str) and isinstance(right, str):
        return left + right
    if op == "+" and isinstance(left, list) and isinstance(right, list):
        return left + right
    if not (isinstance(left, int | float) and isinstance(right, int | float)):
        raise CelError(f"no such overload: {type(left).__name__} {op} {type(right).__name__}")
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        raise CelError("division by zero")
    if op == "/":
        return left // right if isinstance(left, int) and isinstance(right, int) else left / right
    return left % right


def _method(target: Any, name: str, args: list[Any]) -> Any:
    if isinstance(target, Quantity | SemVer):
        if name in ("compareTo", "isGreaterThan", "isLessThan") and len(args) == 1:
            other = args[0]
            if type(other) is not type(target):
                raise CelError(f"{name} needs a {type(target).__name__}")
            cmp = (target > other) - (target < other)
            return {"compareTo": cmp, "isGreaterThan": cmp > 0, "isLessThan": cmp < 0}[name]
        if isinstance(target, Quantity) and name == "asInteger":
            return int(target.value)
        if isinstance(target, SemVer) and name in ("major", "minor", "patch"):
            return getattr(target, name)
    if isinstance(target, str):
        if name == "startsWith":
            return target.startswith(_str_arg(name, args))
        if name == "endsWith":
            return target.endswith(_str_arg(name, args))
        if name == "contains":
            return _str_arg(name, args) in target
        if name == "matches":
            return re.search(_str_arg(name, args), target) is not None
        if name == "lowerAscii":
            return target.lower()
        if name == "upperAscii":
            return target.upper()
    if name == "size" and not args and isinstance(target, str | list | dict):
        return len(target)
    raise CelError(f"no such method {name} on {type(target).__name__}")


def _str_arg(name: str, args: list[Any]) -> str:
    if len(args) != 1 or not isinstance(args[0], str):
        raise CelError(f"{name} needs one string argument")
    return args[0]


def _call(name: str, args: list[Any]) -> Any:
    if name == "quantity" and len(args) == 1 and isinstance(args[0], str):
        return Quantity.parse(args[0])
    if name == "semver" and len(args) == 1 and isinstance(args[0], str):
        return SemVer.parse(args[0])
    if name == "size" and len(args) == 1 and isinstance(args[0], str | list | dict):
        return len(args[0])
    if name == "int" and len(args) == 1:
        try:
            return int(args[0])
        except (TypeError, ValueError) as err:
            raise CelError(str(err)) from err
    if name == "double" and len(args) == 1:
        try:
            return float(args[0])
        except (TypeError, ValueError) as err:
            raise CelError(str(err)) from err
    if name == "string" and len(args) == 1:
        value = args[0]
        return ("true" if value else "false") if isinstance(value, bool) else str(value)
    raise CelError(f"no such function {name}/{len(args)}")


def _select(target: Any, field: str) -> Any:
    if isinstance(target, dict):
        if field not in target:
            raise CelError(f"no such key: {field}")
        return target[field]
    raise CelError(f"cannot select {field} on {type(target).__name__}")


def _eval(node: Node, env: dict[str, Any]) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "ident":
        if node[1] not in env:
            raise CelError(f"undeclared reference to {node[1]!r}")
        return env[node[1]]
    if kind == "select":
        return _select(_eval(node[1], env), node[2])
    if kind == "index":
        target, key = _eval(node[1], env), _eval(node[2], env)
        if isinstance(target, dict):
            if key not in target and not isinstance(target, _DomainMap):
                raise CelError(f"no such key: {key}")
            return target[key]
        if isinstance(target, list):
            if not isinstance(key, int) or isinstance(key, bool) or not 0 <= key < len(target):
                raise CelError(f"index out of range: {key}")
            return target[key]
        raise CelError(f"cannot index {type(target).__name__}")
    if kind == "and" or kind == "or":
        short = kind == "or"  # the value that decides the result on its own
        error: CelError | None = None
        for side in (node[1], node[2]):
            try:
                if _truthy(_eval(side, env)) is short:
                    return short
            except CelError as err:
                error = err
        if error is not None:
            raise error
        return not short
    if kind == "not":
        return not _truthy(_eval(node[1], env))
    if kind == "neg":
        value = _eval(node[1], env)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise CelError("no such overload: -" + type(value).__name__)
        return -value
    if kind == "cond":
        return _eval(node[2] if _truthy(_eval(node[1], env)) else node[3], env)
    if kind == "bin":
        op, left, right = node[1], _eval(node[2], env), _eval(node[3], env)
        if op == "in":
            if isinstance(right, list | dict):
                return left in right
            raise CelError(f"'in' needs a list or map, got {type(right).__name__}")
        if op in ("==", "!=", "<", "<=", ">", ">="):
            return _compare(op, left, right)
        return _arith(op, left, right)
    if kind == "list":
        return [_eval(item, env) for item in node[1]]
    if kind == "map":
        return {_eval(k, env): _eval(v, env) for k, v in node[1]}
    if kind == "call":
        name, args = node[1], node[2]
        if name == "has":
            if len(args) != 1 or args[0][0] != "select":
                raise CelError("has() needs a field selection such as has(a.b)")
            target = _eval(args[0][1], env)
            return isinstance(target, dict) and args[0][2] in target
        return _call(name, [_eval(arg, env) for arg in args])
    if kind == "method":
        return _method(_eval(node[1], env), node[2], [_eval(arg, env) for arg in node[3]])
    raise CelError(f"unknown node {kind}")  # pragma: no cover - the parser makes no others


@dataclass(frozen=True)
class Program:
    """A parsed expression; `evaluate(env)` may be called any number of times."""

    text: str
    ast: Node

    def evaluate(self, env: dict[str, Any]) -> Any:
        return _eval(self.ast, env)

    def matches(self, env: dict[str, Any]) -> bool:
        """Selector semantics: must be a bool; an evaluation error is reported to the caller."""
        result = self.evaluate(env)
        if not isinstance(result, bool):
            raise CelError(f"selector {self.text!r} returned {type(result).__name__}, not bool")
        return result


@lru_cache(maxsize=1024)
def compile_expr(text: str) -> Program:
    """Parse `text` (ValueError names the position of a syntax error). Cached by text."""
    return Program(text, _Parser(text).parse())


# --------------------------------------------------------------------------------------------
# The DRA `device` variable
# --------------------------------------------------------------------------------------------


def _attribute_value(raw: dict[str, Any]) -> Any:
    if "version" in raw:
        return SemVer.parse(raw["version"])
    for key in ("string", "int", "bool"):
        if key in raw:
            return raw[key]
    raise CelError(f"attribute value without a type: {raw!r}")


def _split(name: str, driver: str) -> tuple[str, str]:
    """`gpu.nvidia.com/productName` -> (domain, id); a bare id belongs to the driver."""
    if "/" in name:
        domain, _, ident = name.rpartition("/")
        return domain, ident
    return driver, name


def device_env(driver: str, device: dict[str, Any]) -> dict[str, Any]:
    """The CEL environment for one ResourceSlice device (v1 shape, or v1beta1 `basic`)."""
    body = device.get("basic", device)
    attributes: _DomainMap = _DomainMap()
    for name, raw in (body.get("attributes") or {}).items():
        domain, ident = _split(name, driver)
        attributes.setdefault(domain, {})[ident] = _attribute_value(raw)
    capacity: _DomainMap = _DomainMap()
    for name, raw in (body.get("capacity") or {}).items():
        domain, ident = _split(name, driver)
        text = raw.get("value") if isinstance(raw, dict) else raw
        capacity.setdefault(domain, {})[ident] = Quantity.parse(str(text))
    return {
        "device": {
            "driver": driver,
            "attributes": attributes,
            "capacity": capacity,
            "allowMultipleAllocations": bool(body.get("allowMultipleAllocations", False)),
        }
    }
