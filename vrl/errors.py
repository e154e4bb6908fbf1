"""The one base class of every error vrl raises on purpose.

A bad record, file, key, model, task set, checkpoint, config or store is a :class:`VrlError`
subclass defined where it is detected, and its message names the file, record or key. The
CLI turns any of them into one clear line; anything else is a bug and keeps its traceback.
Errors of the leaf packages (:class:`proofs.errors.ProofsError`, :class:`p2p.transport.
TransportError`) stay theirs, since those packages never import :mod:`vrl`.
"""


class VrlError(Exception):
    """Base class of vrl's own errors."""
