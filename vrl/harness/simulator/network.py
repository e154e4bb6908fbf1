"""The simulated network: who is linked to whom, the gossipsub mesh over those links, how long
a message takes to reach each node, and what a node's forwarding costs it.

The model (stated once, here):

* **Links.** ``devnet`` topology: each node dials the trainer and the node before it, as
  vrl.harness.devnet.plan configures real devnets; ``random``: each node dials D random
  earlier nodes. Links are symmetric.
* **Mesh.** Gossipsub keeps, per topic, a mesh of D peers among a node's links, grafting up to
  D_high when others ask (libp2p gossipsub v1.1 spec defaults D = 6, D_low = 4, D_high = 12, the
  values p2p/libp2p_transport.py hands py-libp2p's GossipSub: GOSSIP_DEGREE*). The mesh is
  built once: each node, in a seeded random order, grafts links until it has min(D, links)
  mesh peers, a peer taking at most D_high.
* **Delivery.** Every node receives each message once (gossipsub's seen-cache drops the
  duplicates, which cost bandwidth but are not deliveries: the metric counts deliveries). A
  message reaches a node after ``hops`` mesh hops, each costing the link latency plus the
  message's transmission time at the link bandwidth; hops are mesh distances (BFS).
* **Forwarding.** The origin sends a message to each of its mesh peers; every node that accepts
  it forwards it to its mesh peers but the one it came from: ``mesh_degree - 1`` copies. A
  message the validator ignores or rejects is not forwarded (p2p.transport's contract).
* **Faults.** ``loss``: a delivery missed by gossip, recovered by the receiver's next backfill
  pass (vrl.node.daemon.BACKFILL_EVERY_SECONDS) if the message is still in the backfill window;
  a partition cuts a share of the nodes off from the rest until it heals; churn takes nodes
  offline for a round (what they miss comes by backfill when they return).
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np

from p2p._common import GOSSIP_DEGREE, GOSSIP_DEGREE_HIGH
from vrl.node.daemon import BACKFILL_EVERY_SECONDS


class Network:
    """Links, mesh and hop distances of ``nodes`` nodes (index 0 the trainer)."""

    def __init__(self, nodes: int, topology: str, rng: random.Random, latency_s: float, bandwidth_bps: float,
                 loss: float) -> None:
        self.rng, self.latency_s, self.bandwidth_bps, self.loss = rng, latency_s, bandwidth_bps, loss
        self.links: list[set[int]] = []
        self.mesh: list[set[int]] = []
        self._hops: dict[int, np.ndarray] = {}
        self.cut: set[int] = set()  # nodes on the far side of a partition
        self.offline: set[int] = set()
        for _ in range(nodes):
            self.add_node(topology)

    @property
    def size(self) -> int:
        return len(self.links)

    def add_node(self, topology: str = "devnet") -> int:
        """A node joins: it dials as the topology says and grafts its mesh. Returns its index."""
        i = len(self.links)
        self.links.append(set())
        self.mesh.append(set())
        if i == 0:
            return i
        if topology == "devnet":
            dials = {0, i - 1}
        else:
            dials = set(self.rng.sample(range(i), min(GOSSIP_DEGREE, i)))
        for j in dials:
            self.links[i].add(j)
            self.links[j].add(i)
        self._graft(i)
        for j in list(self.links[i]):  # its peers graft it too while short of D
            self._graft(j)
        self._hops.clear()
        return i

    def _graft(self, i: int) -> None:
        want = min(GOSSIP_DEGREE, len(self.links[i]))
        candidates = [j for j in self.links[i] if j not in self.mesh[i] and len(self.mesh[j]) < GOSSIP_DEGREE_HIGH]
        self.rng.shuffle(candidates)
        for j in candidates:
            if len(self.mesh[i]) >= want:
                break
            self.mesh[i].add(j)
            self.mesh[j].add(i)

    def forwards(self, i: int, origin: bool) -> int:
        """Copies node ``i`` sends of a message it accepted: every mesh peer if it published it,
        else every mesh peer but the one it came from."""
        degree = len(self.mesh[i])
        return degree if origin else max(degree - 1, 0)

    def hops(self, origin: int) -> np.ndarray:
        """Mesh distance from ``origin`` to every node (BFS; unreachable: the node count)."""
        cached = self._hops.get(origin)
        if cached is not None:
            return cached
        n = self.size
        dist = np.full(n, n, dtype=np.int32)
        dist[origin] = 0
        queue = deque([origin])
        while queue:
            u = queue.popleft()
            for v in self.mesh[u]:
                if dist[v] == n:
                    dist[v] = dist[u] + 1
                    queue.append(v)
        self._hops[origin] = dist
        return dist

    def arrivals(self, origin: int, size: int, now: float) -> np.ndarray:
        """When a message of ``size`` bytes published by ``origin`` at ``now`` reaches each node."""
        per_hop = self.latency_s + size / self.bandwidth_bps
        return now + self.hops(origin) * per_hop

    def reachable(self, a: int, b: int) -> bool:
        """Whether traffic passes between two online nodes (a partition separates the cut set)."""
        return (a in self.cut) == (b in self.cut) and a not in self.offline and b not in self.offline

    def backfill_at(self, now: float) -> float:
        """When a node's next backfill pass runs: passes every BACKFILL_EVERY_SECONDS, at a
        phase of its own (uniform)."""
        return now + self.rng.uniform(0, BACKFILL_EVERY_SECONDS)

    def missed(self) -> bool:
        return self.loss > 0 and self.rng.random() < self.loss
