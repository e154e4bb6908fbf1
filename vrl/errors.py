"""The one base class of every error vrl raises on purpose.

A bad record, file, key, model, task set, checkpoint, config or store is a :class:`VrlError`
subclass defined where it is detected, and its message names the file, record or key. The
CLI turns any of them into one clear line; anything else is a bug and keeps its traceback.
Errors of the leaf packages (:class:`proofs.errors.ProofsError`, :class:`p2p.transport.
TransportError`) stay theirs, since those packages never import :mod:`vrl`.

A message quotes what it was given through :func:`shown`, cut short: the value may be
hostile, a record's or a file's.
"""

import reprlib

#: Integers past this many bits are named by their size: repr refuses past 4,300 digits, and a
#: TOML hex literal or msgpack is not held to that limit.
MAX_SHOWN_BITS = 256


class _Shown(reprlib.Repr):
    def repr_int(self, value: int, level: int) -> str:
        if value.bit_length() > MAX_SHOWN_BITS:
            return f"an integer of {value.bit_length()} bits"
        return super().repr_int(value, level)


_SHOWN = _Shown()  # Python 3.11's takes no arguments: its limits are attributes
_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxtuple = 3, 4, 4, 4
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 60, 60, 80
#: The longest quote a message makes; a line of the CLI's error output stays readable.
MAX_SHOWN = 80


class VrlError(Exception):
    """Base class of vrl's own errors."""


def shown(value: object) -> str:
    """``value``'s repr for an error message: whole up to MAX_SHOWN characters, else its start
    and its length. A hostile value may be a megabyte, an integer past repr's 4300 digits, or
    tables nested a thousand deep (reprlib stops at 3 levels)."""
    text = _SHOWN.repr(value)
    return text if len(text) <= MAX_SHOWN else text[:60] + f"... ({len(text)} characters)"
