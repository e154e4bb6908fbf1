"""The request/response maps two peers exchange (``specs/network.md`` §3.4, §3.5, §6): a
backfill request and page, a group request of the committee design, and a sampling request.
Unlike the gossip messages (:mod:`vrl.node.messages`) they carry no ``kind`` or version and are
not canonical: a map of exactly their fields, decoded as strictly (:mod:`vrl.node.wire`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vrl.errors import shown
from vrl.node import committee
from vrl.node.wire import U64, Bin, Blobs, Choice, Listed, Message, MessageError, Nullable, Uint, decode, message, wire
from vrl.rollouts.codec import FieldError

# -- backfill: request/response between two peers (specs/network.md §6) ----------------------

#: A page holds whole gossip messages (each at most the transport's 256 KiB gossip cap), at
#: most 1 MiB of them (the server's page, under the transport's 2 MiB response cap,
#: specs/network.md §7) and at most this many: ~4,400 of the smallest kind (a ~240-byte
#: policy) would fit in 1 MiB, so servers stop a page at this count too (Store.since).
BACKFILL_MAX_MESSAGES = 4096
BACKFILL_MAX_MESSAGE_BYTES = 256 << 10
#: A cursor (specs/network.md §6): the server's store generation, then one watermark per table
#: in the order of kinds (policies, manifests, groups, verdicts, steps). A watermark is an SQLite
#: rowid, which is at most 2^63 - 1 (https://sqlite.org/lang_createtable.html#rowid).
BACKFILL_CURSOR_TABLES = 5
BACKFILL_WATERMARK_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Cursor:
    """A backfill cursor on the wire: ``[generation, w_1, ..., w_5]``, the generation a u64 and
    each watermark in ``[0, 2^63 - 1]``; decoded to a tuple of 6 ints."""

    as_is: ClassVar[bool] = False

    def decode(self, value: Any, name: str) -> tuple[int, ...]:
        if (type(value) is not list or len(value) != 1 + BACKFILL_CURSOR_TABLES
                or not all(type(v) is int for v in value) or not 0 <= value[0] <= U64
                or not all(0 <= v <= BACKFILL_WATERMARK_MAX for v in value[1:])):
            raise FieldError(name, f"expected a list of {1 + BACKFILL_CURSOR_TABLES} uints, a u64 then "
                                   f"{BACKFILL_CURSOR_TABLES} in [0, 2^63 - 1], got {shown(value)}")
        return tuple(value)

    def encode(self, value: tuple[int, ...]) -> list[int]:
        return list(value)


#: What a client holds, named before the bodies cross (specs/network.md §6, ``have``): an 8-byte
#: salt, then at most this many 8-byte short ids. The short ids are salted per request, as
#: Bitcoin's compact blocks salt theirs (BIP 152): a producer cannot grind a message whose short
#: id collides with a known message's in every client's request. 4,096, the page's message bound,
#: covers what a node stores between two passes 5 s apart (~560 messages a round per node at
#: N = 1,000, bench/results/simulate-scale.json); 32 KiB a request at most.
BACKFILL_HAVE_MAX = BACKFILL_MAX_MESSAGES
SHORT_ID_BYTES = 8


def short_id(salt: bytes, data: bytes) -> bytes:
    """A message's short id in a request salted with ``salt`` (specs/network.md §6): the first 8
    bytes of SHA-256(salt || the message's bytes)."""
    return hashlib.sha256(salt + data).digest()[:SHORT_ID_BYTES]


@dataclass(frozen=True, slots=True)
class ShortIds:
    """``have`` on the wire: a bin of ``8 + 8 k`` bytes, ``k`` in ``[1, 4096]``: the salt, then
    ``k`` short ids; decoded as it is."""

    as_is: ClassVar[bool] = True
    max_items: int = BACKFILL_HAVE_MAX

    def decode(self, value: Any, name: str) -> bytes:
        if (type(value) is not bytes or len(value) % SHORT_ID_BYTES
                or not 2 * SHORT_ID_BYTES <= len(value) <= SHORT_ID_BYTES * (1 + self.max_items)):
            raise FieldError(name, f"expected a bin of 8 + 8 k bytes, k in [1, {self.max_items}], got "
                                   f"{type(value).__name__} {shown(value)}")
        return value

    def encode(self, value: bytes) -> bytes:
        return value


@message("backfill request")
@dataclass(frozen=True)
class BackfillRequest(Message):
    """``{"since": r, "after": n}``: messages of rounds >= ``since``, from position ``after``;
    with ``"cursor"``, those the server stored past the cursor, less those whose short ids
    ``"have"`` lists (specs/network.md §6)."""

    since: int = field(metadata=wire(Uint()))
    after: int = field(metadata=wire(Uint()))
    cursor: tuple[int, ...] | None = field(default=None, metadata=wire(Cursor(), optional=True))
    have: bytes | None = field(default=None, metadata=wire(ShortIds(), optional=True))

    def _cross_check(self) -> None:
        if self.have is not None and self.cursor is None:
            raise FieldError("have", "is given only with a cursor (a position counts what the peer pages)")

    @property
    def salt(self) -> bytes:
        return self.have[:SHORT_ID_BYTES] if self.have is not None else b""

    def held(self) -> frozenset[bytes]:
        """The short ids ``have`` lists (none without it)."""
        if self.have is None:
            return frozenset()
        return frozenset(self.have[i:i + SHORT_ID_BYTES] for i in range(SHORT_ID_BYTES, len(self.have), SHORT_ID_BYTES))


@message("group request")
@dataclass(frozen=True)
class GroupRequest(Message):
    """``{"group": digest, "version": v}``: one group by its digest (specs/network.md §3.5, the
    committee design); the answer is the group's gossip message bytes, which must hash to it."""

    group: bytes = field(metadata=wire(Bin(32)))
    version: int = field(metadata=wire(Uint()))  # the round whose manifest lists it


@message("entries request")
@dataclass(frozen=True)
class EntriesRequest(Message):
    """``{"round": r, "list": ..., "positions": [...], "keys": [...]}``: entries of one list of a
    paged round manifest, by position or by key, exactly one of them non-empty
    (specs/committee.md §3.5)."""

    round: int = field(metadata=wire(Uint()))
    list: committee.List = field(metadata=wire(Choice(committee.List)))
    positions: tuple[int, ...] = field(
        metadata=wire(Listed("position", committee.MAX_ENTRIES_PER_REQUEST, committee.MAX_PAGED_ENTRIES)))
    keys: tuple[bytes, ...] = field(metadata=wire(Listed("key", committee.MAX_ENTRIES_PER_REQUEST)))

    def _cross_check(self) -> None:
        if bool(self.positions) == bool(self.keys):
            raise FieldError("positions", "an entries request names positions or keys, exactly one of them")


#: Leaves in an entries answer: a key asked may be answered by two neighbours (§3.5).
ENTRIES_MAX_LEAVES = 2 * committee.MAX_ENTRIES_PER_REQUEST


@message("entries")
@dataclass(frozen=True)
class EntriesAnswer(Message):
    """The answer to an :class:`EntriesRequest`: positions, their leaves, and the multiproof of
    them under the list's root (specs/committee.md §3.5, specs/merkle.md §2)."""

    round: int = field(metadata=wire(Uint()))
    list: committee.List = field(metadata=wire(Choice(committee.List)))
    positions: tuple[int, ...] = field(
        metadata=wire(Listed("position", ENTRIES_MAX_LEAVES, committee.MAX_PAGED_ENTRIES)))
    leaves: tuple[bytes, ...] = field(metadata=wire(Listed("leaf", ENTRIES_MAX_LEAVES, 36)))
    # At most a leaf's path each: 18 hashes for 2^18 entries (specs/merkle.md §2).
    proof: tuple[bytes, ...] = field(
        metadata=wire(Listed("hash", ENTRIES_MAX_LEAVES * committee.MAX_PAGED_ENTRIES.bit_length())))

    @classmethod
    def of(cls, entries: committee.Entries) -> EntriesAnswer:
        return cls(entries.round, entries.list, entries.positions, entries.leaves, entries.proof)

    @property
    def entries(self) -> committee.Entries:
        return committee.Entries(self.round, self.list, self.positions, self.leaves, self.proof)

    def _cross_check(self) -> None:
        if len(self.leaves) != len(self.positions):
            raise FieldError("leaves", f"{len(self.leaves)} leaves for {len(self.positions)} positions")


@message("sampling request")
@dataclass(frozen=True)
class SamplingRequest(Message):
    """``{"group": digest, "challenge": 32 bytes, "positions": k}``: prove ``k`` positions of each
    record of one's own group, where ``challenge`` picks them (specs/network.md §3.4; the
    answer is a ``vrl/sampling/v1`` file, specs/zk.md §10)."""

    group: bytes = field(metadata=wire(Bin(32)))
    challenge: bytes = field(metadata=wire(Bin(32)))
    positions: int = field(metadata=wire(Uint(1, 64)))  # K in [1, 64] (specs/network.md §3.4)


@message("backfill page")
@dataclass(frozen=True)
class BackfillPage(Message):
    """``{"messages": [bin, ...], "next": n | nil}``: one page of a peer's log; ``next`` is
    where the following page starts (always past the request's ``after``), nil at the end;
    ``cursor`` (exactly when the request had one) is where the next request starts."""

    messages: tuple[bytes, ...] = field(
        metadata=wire(Blobs(0, BACKFILL_MAX_MESSAGES, BACKFILL_MAX_MESSAGE_BYTES)))
    next: int | None = field(metadata=wire(Nullable(Uint())))
    cursor: tuple[int, ...] | None = field(default=None, metadata=wire(Cursor(), optional=True))

    @classmethod
    def from_bytes(cls, data: bytes, after: int,  # type: ignore[override]
                   cursor: tuple[int, ...] | None = None) -> BackfillPage:
        """The page answering a request from ``after`` with ``cursor`` (None: a request without one)."""
        page = decode(cls, data)
        if page.next is not None and page.next <= after:
            raise MessageError(f"backfill page: field 'next' must move past {after}, got {page.next}")
        if (page.cursor is None) != (cursor is None):
            raise MessageError(f"backfill page: field 'cursor' must be {'absent' if cursor is None else 'given'},"
                               " as in the request")
        # The same generation names the same positions: a watermark only moves on.
        if page.cursor is not None and cursor is not None and page.cursor[0] == cursor[0] and any(
                new < old for new, old in zip(page.cursor[1:], cursor[1:], strict=True)):
            raise MessageError(f"backfill page: field 'cursor' goes back from {list(cursor)} to {list(page.cursor)}")
        return page
