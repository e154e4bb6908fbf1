"""Merkle trees over a list of byte strings, and proofs that some of them are in it
(specs/merkle.md).

The tree is RFC 9162's (section 2.1.1, as RFC 6962 section 2.1): a leaf hashes as
``H(0x00 || leaf)``, an inner node as ``H(0x01 || left || right)``, and a list of ``n > 1``
leaves splits at ``k``, the largest power of two below ``n``; the empty list's root is
``H("")``. The 0x00 / 0x01 prefixes keep a leaf from passing for an inner node (the second
preimage that RFC 6962 section 2.1 closes).

A proof covers any set of leaf positions at once (a *multiproof*; RFC 9162's audit path is the
one-position case, in another order): the hashes of the largest subtrees that hold no proven
position, in the order a left-to-right walk of the tree meets them (specs/merkle.md §2). A
member that sits on 44 of 4,000 groups proves all of them with about 250 hashes instead of
44 x 12, and one that sits on all of them with none.

:class:`Tree` keeps every subtree's hash, packed a level at a time, so that the trainer answers
each member's request in time proportional to the proof, not to the tree. :func:`verify` checks types and
ranges before it hashes anything (a proof's length as its walk takes the hashes), does work
proportional to its input, and raises only
:class:`MerkleError`; it compares the root in constant time.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
from collections.abc import Sequence

from proofs.errors import ProofsError

__all__ = ["HASH_BYTES", "MAX_LEAF_BYTES", "MAX_SIZE", "MerkleError", "Tree", "leaf_hash", "paths", "proof_length",
           "root", "verify"]

HASH_BYTES = 32
#: Sizes are u32 wherever the bytes carry them (specs/merkle.md §3).
MAX_SIZE = (1 << 32) - 1
#: The leaves this project commits are 32 bytes (a digest) or 36 (a node id and a u32,
#: specs/committee.md §10); a longer one is refused before it is hashed.
MAX_LEAF_BYTES = 64

_LEAF, _NODE = b"\x00", b"\x01"


class MerkleError(ProofsError, ValueError):
    """A tree, a proof or its inputs that break specs/merkle.md; ``reason`` is its code:
    ``bad_input`` (a type, length or range), ``bad_proof`` (too few or too many hashes) or
    ``mismatch`` (well formed, but not under the root)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def leaf_hash(leaf: bytes) -> bytes:
    """H(0x00 || leaf)."""
    return hashlib.sha256(_LEAF + _leaf(leaf, "leaf")).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE + left + right).digest()


def _split(size: int) -> int:
    """The largest power of two below ``size`` (> 1): where RFC 9162 splits a list."""
    return 1 << ((size - 1).bit_length() - 1)


def _leaf(value: object, what: str) -> bytes:
    if type(value) is not bytes or len(value) > MAX_LEAF_BYTES:
        raise MerkleError("bad_input", f"{what}: expected at most {MAX_LEAF_BYTES} bytes, got {_shown(value)}")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _positions(size: object, indices: object) -> tuple[int, tuple[int, ...]]:
    """Check a tree size and a set of proven positions: 1 <= size <= MAX_SIZE, positions
    strictly increasing in [0, size), at least one."""
    if type(size) is not int or not 1 <= size <= MAX_SIZE:
        raise MerkleError("bad_input", f"tree size must be an int in [1, {MAX_SIZE}], got {_shown(size)}")
    if not isinstance(indices, tuple | list) or not 1 <= len(indices) <= size:
        raise MerkleError("bad_input", f"positions must be a list of 1 to {size} ints, got {_shown(indices)}")
    previous = -1
    for i in indices:
        if type(i) is not int or not previous < i < size:
            raise MerkleError("bad_input", f"positions must increase strictly within [0, {size}), at {_shown(i)}")
        previous = i
    return size, tuple(indices)


def proof_length(size: int, indices: Sequence[int]) -> int:
    """How many hashes the proof of ``indices`` in a tree of ``size`` leaves has: the number of
    maximal subtrees holding none of them. At most len(indices) x ceil(log2 size)."""
    size, indices = _positions(size, indices)
    count = 0
    stack = [(0, size, 0, len(indices))]
    while stack:
        lo, hi, i0, i1 = stack.pop()
        if i0 == i1:
            count += 1
        elif hi - lo > 1:
            mid = lo + _split(hi - lo)
            j = bisect.bisect_left(indices, mid, i0, i1)
            stack += [(lo, mid, i0, j), (mid, hi, j, i1)]
    return count


class Tree:
    """A list of leaves and every subtree's hash: its root, and the proof of any positions.

    The hashes are kept a level at a time, each level one packed ``bytes`` (32 bytes a node):
    level 0 the leaf hashes, level ``h + 1`` the nodes over each pair of level ``h``, an odd
    last node carried up unchanged. That is RFC 9162's tree: a list splits at the largest power
    of two below its size, so each of its subtrees starts at a multiple of the smallest power of
    two ``2^h`` at least its size, and is level ``h``'s node there (specs/merkle.md §1). About
    ``64 n`` bytes of hashes for ``n`` leaves: 18 MiB held at 2^18, 72 bytes an entry, where one
    dict entry a subtree held 90 MiB, and a build about twice the bare SHA-256 calls' time, not
    four to six times (``bench/merkle.py``, ``bench/results/merkle.json``).
    """

    def __init__(self, leaves: Sequence[bytes]) -> None:
        if not isinstance(leaves, tuple | list) or len(leaves) > MAX_SIZE:
            raise MerkleError("bad_input", "leaves must be a list of at most 2^32 - 1 byte strings")
        self.leaves = tuple(_leaf(leaf, f"leaf {i}") for i, leaf in enumerate(leaves))
        level = b"".join(hashlib.sha256(_LEAF + leaf).digest() for leaf in self.leaves)
        self._levels = [level]
        while len(level) > HASH_BYTES:
            pairs = len(level) // (2 * HASH_BYTES) * 2 * HASH_BYTES
            level = b"".join(hashlib.sha256(_NODE + level[i:i + 2 * HASH_BYTES]).digest()
                             for i in range(0, pairs, 2 * HASH_BYTES)) + level[pairs:]
            self._levels.append(level)
        self.root = level if self.leaves else hashlib.sha256(b"").digest()

    def __len__(self) -> int:
        return len(self.leaves)

    def _hash(self, lo: int, hi: int) -> bytes:
        """The hash of the subtree over positions ``[lo, hi)``, one of the tree's own."""
        height = (hi - lo - 1).bit_length()
        at = (lo >> height) * HASH_BYTES
        return self._levels[height][at:at + HASH_BYTES]

    def prove(self, indices: Sequence[int]) -> tuple[bytes, ...]:
        """The proof of the leaves at ``indices`` (strictly increasing): specs/merkle.md §2."""
        size, indices = _positions(len(self.leaves), indices)
        proof: list[bytes] = []
        stack = [(0, size, 0, len(indices))]
        while stack:  # left before right: the order the proof lists them in
            lo, hi, i0, i1 = stack.pop()
            if i0 == i1:
                proof.append(self._hash(lo, hi))
            elif hi - lo > 1:
                mid = lo + _split(hi - lo)
                j = bisect.bisect_left(indices, mid, i0, i1)
                stack += [(mid, hi, j, i1), (lo, mid, i0, j)]
        return tuple(proof)


def root(leaves: Sequence[bytes]) -> bytes:
    """The root of a list of leaves (RFC 9162 section 2.1.1's MTH)."""
    return Tree(leaves).root


def verify(expected_root: bytes, size: int, indices: Sequence[int], leaves: Sequence[bytes],
           proof: Sequence[bytes]) -> None:
    """Check that ``leaves`` are the leaves at ``indices`` of the tree of ``size`` leaves whose
    root is ``expected_root``; returns None, raises MerkleError (``bad_input``, ``bad_proof``
    or ``mismatch``). Work is one hash per leaf and per proof hash, plus one per inner node of
    the walk: at most len(indices) x 33 + len(proof)."""
    _walk(expected_root, size, indices, leaves, proof, keep=False)


def paths(expected_root: bytes, size: int, indices: Sequence[int], leaves: Sequence[bytes],
          proof: Sequence[bytes]) -> tuple[tuple[bytes, ...], ...]:
    """Verify as :func:`verify`, then return each position's own one-position proof: every
    sibling on its way to the root is a proof hash or a subtree the walk computed. What a member
    that fetched its seats with one multiproof puts in each claim (specs/committee.md §4)."""
    known = _walk(expected_root, size, indices, leaves, proof, keep=True)
    out = []
    for i in indices:
        path, lo, hi = [], 0, size
        siblings = []
        while hi - lo > 1:
            mid = lo + _split(hi - lo)
            if i < mid:
                siblings.append((1, known[mid, hi]))  # right of i: listed after the deeper ones
                hi = mid
            else:
                path.append(known[lo, mid])  # left of i: listed before the deeper ones
                lo = mid
        # Left-to-right: the left siblings top-down, then the right ones bottom-up.
        out.append(tuple(path + [h for _, h in reversed(siblings)]))
    return tuple(out)


def _walk(expected_root: bytes, size: int, indices: Sequence[int], leaves: Sequence[bytes],
          proof: Sequence[bytes], keep: bool) -> dict[tuple[int, int], bytes]:
    """The walk of :func:`verify`; with ``keep``, returns the hash of every subtree it met, by
    (lo, hi) (:func:`paths`), else an empty dict."""
    if type(expected_root) is not bytes or len(expected_root) != HASH_BYTES:
        raise MerkleError("bad_input", f"a root is {HASH_BYTES} bytes, got {_shown(expected_root)}")
    size, indices = _positions(size, indices)
    if not isinstance(leaves, tuple | list) or len(leaves) != len(indices):
        raise MerkleError("bad_input", f"expected {len(indices)} leaves, one a position, got {_shown(leaves)}")
    for i, leaf in zip(indices, leaves, strict=True):
        _leaf(leaf, f"leaf at position {i}")
    if not isinstance(proof, tuple | list):
        raise MerkleError("bad_input", f"a proof is a list of {HASH_BYTES}-byte hashes, got {_shown(proof)}")
    for h in proof:
        if type(h) is not bytes or len(h) != HASH_BYTES:
            raise MerkleError("bad_input", f"a proof hash is {HASH_BYTES} bytes, got {_shown(h)}")
    if len(indices) == 1 and not keep:
        top = _climb(size, indices[0], leaf_hash(leaves[0]), proof)
        known: dict[tuple[int, int], bytes] = {}
    else:
        top, known = _descend(size, indices, [leaf_hash(leaf) for leaf in leaves], proof, keep)
    if not hmac.compare_digest(top, expected_root):
        raise MerkleError("mismatch", f"these {len(indices)} leaves and the proof do not give the root")
    return known


def _wrong_length(size: int, indices: Sequence[int], proof: Sequence[bytes]) -> MerkleError:
    return MerkleError("bad_proof", f"a proof of these {len(indices)} positions in {size} leaves has "
                                    f"{proof_length(size, indices)} hashes, got {len(proof)}")


def _climb(size: int, index: int, hashed: bytes, proof: Sequence[bytes]) -> bytes:
    """The walk for one position, from its leaf hash up: each split on the way down puts the
    sibling left or right of it. In walk order the proof lists the left siblings top-down, then
    the right ones bottom-up (specs/merkle.md §2), so both are read from the leaf up without
    the walk's stack: the one-position check is every claim's (specs/committee.md §4), two a
    verdict at the trainer."""
    lo, hi, right_of = 0, size, []
    while hi - lo > 1:
        mid = lo + _split(hi - lo)
        right_of.append(index >= mid)
        lo, hi = (mid, hi) if index >= mid else (lo, mid)
    if len(proof) != len(right_of):
        raise _wrong_length(size, (index,), proof)
    lefts = sum(right_of)
    left, right = iter(proof[lefts - 1::-1] if lefts else ()), iter(proof[lefts:])
    for is_right in reversed(right_of):
        hashed = _node(next(left), hashed) if is_right else _node(hashed, next(right))
    return hashed


def _descend(size: int, indices: Sequence[int], hashes: list[bytes], proof: Sequence[bytes],
             keep: bool) -> tuple[bytes, dict[tuple[int, int], bytes]]:
    """The walk of specs/merkle.md §2, post-order as Tree._hash: subtrees with no proven
    position take the next proof hash. A proof too short runs out during it, one too long
    has hashes left after it: either is ``bad_proof``, counted only then."""
    taken = iter(proof)
    known: dict[tuple[int, int], bytes] = {}
    stack, out = [(0, size, 0, len(indices), False)], []
    try:
        while stack:
            lo, hi, i0, i1, children_done = stack.pop()
            if i0 == i1:
                out.append(next(taken))
            elif hi - lo == 1:
                out.append(hashes[i0])
            elif children_done:
                right, left = out.pop(), out.pop()
                out.append(_node(left, right))
            else:
                mid = lo + _split(hi - lo)
                j = bisect.bisect_left(indices, mid, i0, i1)
                stack += [(lo, hi, i0, i1, True), (mid, hi, j, i1, False), (lo, mid, i0, j, False)]
                continue
            if keep:
                known[lo, hi] = out[-1]
    except StopIteration:
        raise _wrong_length(size, indices, proof) from None
    if next(taken, None) is not None:
        raise _wrong_length(size, indices, proof)
    return out[0], known
