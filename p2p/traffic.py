"""What a transport carried for its node: application payload messages and bytes, by kind and
by topic or protocol (:meth:`p2p.transport.Transport.traffic`).

Counted where the transport hands payloads to and from the node, or to and from its peers;
framing, Noise, Yamux, a gossip message's envelope and gossipsub's control messages (IHAVE,
IWANT, GRAFT, PRUNE, IDONTWANT, subscriptions) are not payload (gossipsub's RPCs are counted
whole apart, ``gossip_rpc_out``, on libp2p). The kinds, with the same meaning on every
transport (issue 30's metric definitions, which the simulator uses too):

``gossip_in``
    a gossip message delivered to this node: its first copy only, accepted by the validator,
    and not this node's own publish. The ``bytes_in`` of gossip.
``gossip_out``
    a copy of a gossip message written to one peer: this node's publishes and its forwards
    in the mesh alike (and, on libp2p, what it answers to an IWANT). The ``bytes_out`` of gossip.
``gossip_copies_in``
    every copy of a gossip message that a peer sent this node, duplicates included (what
    ``gossip_out`` of its peers adds up to): the wire's view, beside ``gossip_in``'s.
``gossip_rpc_out`` (libp2p only; name ``rpc``)
    every gossipsub RPC written to a peer, whole: payloads with their envelopes (origin, seqno,
    signature, key, topic), the sender's signed peer record, control messages and
    subscriptions, without the varint length prefix. Beside ``gossip_out``, what the payload
    counts leave out of gossip.
``request_out`` / ``response_in``
    the body of a request this node sent, and of the answer it got (a refusal's detail too).
``request_in`` / ``response_out``
    the body of a request this node was sent, and of the answer it gave.

The name is the gossip topic, or the request protocol (blobs are ``/vrl/blob/1``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

GOSSIP_IN = "gossip_in"
GOSSIP_OUT = "gossip_out"
GOSSIP_COPIES_IN = "gossip_copies_in"
GOSSIP_RPC_OUT = "gossip_rpc_out"
REQUEST_OUT = "request_out"
REQUEST_IN = "request_in"
RESPONSE_OUT = "response_out"
RESPONSE_IN = "response_in"
KINDS = (GOSSIP_IN, GOSSIP_OUT, GOSSIP_COPIES_IN, GOSSIP_RPC_OUT, REQUEST_OUT, REQUEST_IN, RESPONSE_OUT, RESPONSE_IN)


@dataclass(frozen=True, slots=True)
class Count:
    """Messages and their payload bytes."""

    messages: int
    bytes: int


class Traffic:
    """Counters of one transport. Thread-safe: the libp2p transport counts both on its trio
    thread and on the node's loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], tuple[int, int]] = {}

    def add(self, kind: str, name: str, size: int) -> None:
        """One message of ``size`` payload bytes, of ``kind`` (one of :data:`KINDS`), on topic
        or protocol ``name``."""
        if kind not in KINDS:
            raise ValueError(f"unknown traffic kind {kind!r}")
        with self._lock:
            messages, total = self._counts.get((kind, name), (0, 0))
            self._counts[kind, name] = (messages + 1, total + size)

    def snapshot(self) -> dict[tuple[str, str], Count]:
        """Every count so far, by ``(kind, name)``."""
        with self._lock:
            return {key: Count(*value) for key, value in self._counts.items()}
