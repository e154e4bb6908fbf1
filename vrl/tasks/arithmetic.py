"""The built-in arithmetic task generator (specs/tasks.md §2).

Task ``index`` is drawn from SHA-256 in counter mode over the generator's parameters and the
index, so every machine derives the same problem from the same index with no shared state,
and a second implementation needs only the spec. The prompt is the bare expression with an
``=`` (``"37+5*12="``); the answer is its value with the usual precedence (``*`` before
``+``/``-``, left to right), in canonical form.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from vrl.tasks.core import Task

DOMAIN = b"vrl/arithmetic/v1\x00"
OPERATIONS = "+-*"


@dataclass(frozen=True, slots=True)
class Arithmetic:
    """Problems of ``terms`` operands of at most ``digits`` digits joined by ``operations``."""

    digits: int = 2
    operations: str = "+-"
    terms: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise ValueError(f"arithmetic.digits must be in [1, 9], got {self.digits}")
        if not 2 <= self.terms <= 8:
            raise ValueError(f"arithmetic.terms must be in [2, 8], got {self.terms}")
        ops = self.operations
        if not ops or set(ops) - set(OPERATIONS) or len(set(ops)) != len(ops):
            raise ValueError(f"arithmetic.operations must be distinct characters of {OPERATIONS!r}, got {ops!r}")

    @property
    def name(self) -> str:
        return f"arithmetic:digits={self.digits},ops={self.operations},terms={self.terms}"

    @classmethod
    def parse(cls, spec: str) -> Arithmetic:
        """``"arithmetic"`` or ``"arithmetic:digits=3,ops=+-*,terms=2"`` (any subset of keys)."""
        _, _, options = spec.partition(":")
        fields: dict[str, int | str] = {}
        for item in filter(None, options.split(",")):
            key, _, value = item.partition("=")
            if key in ("digits", "terms") and value.isdigit():
                fields[key] = int(value)
            elif key == "ops" and value:
                fields["operations"] = value
            else:
                raise ValueError(f"task spec {spec!r}: cannot read {item!r} (expected digits=N, ops=+-*, terms=N)")
        return cls(**fields)  # type: ignore[arg-type]

    def _draw(self, index: int, counter: int) -> int:
        block = hashlib.sha256(DOMAIN + self.name.encode() + index.to_bytes(8, "big") + counter.to_bytes(4, "big"))
        return int.from_bytes(block.digest()[:8], "big")

    def task(self, index: int) -> Task:
        if not 0 <= index < 1 << 64:
            raise ValueError(f"arithmetic task index must be a u64, got {index}")
        operands = [self._draw(index, 2 * i) % 10**self.digits for i in range(self.terms)]
        operators = [self.operations[self._draw(index, 2 * i + 1) % len(self.operations)]
                     for i in range(self.terms - 1)]
        expression = str(operands[0]) + "".join(op + str(x) for op, x in zip(operators, operands[1:]))
        return Task(id=f"arithmetic/{index:016x}", prompt=expression + "=", answer=str(_evaluate(operands, operators)))


def _evaluate(operands: list[int], operators: list[str]) -> int:
    """Products first, then sums and differences left to right: the usual precedence."""
    total, product, sign = 0, operands[0], 1
    for op, value in zip(operators, operands[1:]):
        if op == "*":
            product *= value
        else:
            total += sign * product
            product, sign = value, 1 if op == "+" else -1
    return total + sign * product
