"""Workers' groups made ahead on other cores: the simulation's one part that needs no state of
the run, so the one it can hand to another process.

Making a round's signed groups is the real record code's work (vrl.harness.simulator.payloads.
Records: 32 records a worker a round, each encoded twice and signed with Ed25519): a quarter of
the simulation's time at N = 1,000 (py-spy, bench/simulate.py). A :class:`Maker` with
``processes`` asks for a node's groups when its generation starts and takes them when it ends,
some simulated seconds and many events later; with none it makes them when taken. The groups
are the same either way: each draws its content from a stream of its own (Records), not from
the run's, so results do not depend on the number of processes.
"""

from __future__ import annotations

import multiprocessing
import resource
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from vrl.node.messages import Group
from vrl.rollouts.keys import NodeKey

from .payloads import Records
from .spec import SimConfig

_records: Records | None = None  # a maker process's own, built once when it starts


def _start(config: SimConfig) -> None:
    global _records
    _records = Records(config)


def _make(seed: bytes, version: int, count: int, reward: float | None) -> tuple[Group, ...]:
    assert _records is not None, "a maker process starts with _start"
    return _records.groups(NodeKey.from_seed(seed), version, count, reward)


class Maker:
    """Nodes' round groups, made in ``processes`` other processes ahead of when they are taken."""

    def __init__(self, records: Records, processes: int = 0) -> None:
        self.records = records
        # spawn, not fork: the simulation has imported torch, whose threads a fork would not carry
        self._pool = (ProcessPoolExecutor(processes, multiprocessing.get_context("spawn"), initializer=_start,
                                          initargs=(records.config,)) if processes else None)
        self._asked: dict[tuple[bytes, int], Future[tuple[Group, ...]]] = {}
        self._children = _children_cpu()
        self.made_ahead = 0  # rounds of groups a maker process made

    def ask(self, key: NodeKey, version: int, count: int, reward: float | None = None) -> None:
        """A node's generation of ``version`` started: its groups may be made now."""
        if self._pool is None:
            return
        try:
            self._asked[key.node_id, version] = self._pool.submit(_make, key.private_seed(), version, count, reward)
        except BrokenProcessPool:  # a maker died: from now on groups are made when taken
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def take(self, key: NodeKey, version: int, count: int, reward: float | None = None) -> tuple[Group, ...]:
        """The node's groups of ``version``: made ahead if they were asked for, else now."""
        future = self._asked.pop((key.node_id, version), None)
        if future is not None:
            try:
                groups = future.result()
                self.made_ahead += 1
                return groups
            except BrokenProcessPool:  # a maker died (out of memory): the same groups, made here
                pass
        return self.records.groups(key, version, count, reward)

    def close(self) -> float:
        """Stop the maker processes; the CPU seconds they spent."""
        if self._pool is None:
            return 0.0
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None
        self._asked.clear()
        return _children_cpu() - self._children


def _children_cpu() -> float:
    """CPU seconds of this process's children that have ended (the makers, once shut down)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
