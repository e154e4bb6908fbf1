"""The rooms a call walks through: which modules and classes of the project a call reaches, and
how often it goes back into one it is still inside.

    from bench.walk import Walk
    with Walk(ROOT) as walk:
        node._on_message(message)          # or whatever is driven
    walk.summary()

A *room* is a module of ``vrl/``, ``p2p/`` or ``proofs/`` (a file: what a reader opens). Every
call from one project function to another (through any number of library frames: asyncio,
torch) is an *edge*, counted once however often it runs:

* a **stay**: the callee is in the caller's room;
* an **entry**: the walk enters the callee's room for the first time;
* a **return**: the walk has been in the callee's room before and left it: a coordinator
  going back to a helper it already used, a collaborator calling back into the coordinator.
  Fewer returns: each room does its part of the job in one visit.

Measured by tracing (``sys.setprofile``), so it sees what runs, lazy imports and dynamic
dispatch included, not what a static reading guesses; coroutines resumed by the event loop
are counted from their awaiting frame. Issue 29 asked for this walk from ``Node._on_message``;
``bench/node_cpu.py --walk`` prints it.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

PACKAGES = ("vrl", "p2p", "proofs")


class Walk:
    """A profiler that records the distinct edges between project functions while active."""

    def __init__(self, root: Path) -> None:
        self.roots = tuple(str(root / p) + "/" for p in PACKAGES)
        self.root = str(root) + "/"
        self.edges: dict[tuple[str, str], str] = {}  # (caller, callee) -> stay | entry | return
        self.rooms: set[str] = set()
        self._rooms: dict[types.CodeType, tuple[str, str] | None] = {}
        self._previous = None

    def _where(self, code: types.CodeType) -> tuple[str, str] | None:
        """``(room, function)`` of a code object, or None outside the project."""
        if code in self._rooms:
            return self._rooms[code]
        found = None
        if code.co_filename.startswith(self.roots):
            module = code.co_filename[len(self.root):].removesuffix(".py").replace("/", ".").removesuffix(".__init__")
            found = (module, f"{module}:{code.co_qualname}")
        self._rooms[code] = found
        return found

    def _profile(self, frame: types.FrameType, event: str, _arg) -> None:
        if event != "call":
            return
        callee = self._where(frame.f_code)
        if callee is None:
            return
        parent = frame.f_back  # the nearest project frame below this one is the caller
        while parent is not None and self._where(parent.f_code) is None:
            parent = parent.f_back
        room = callee[0]
        if parent is not None:
            caller = self._where(parent.f_code)
            key = (caller[1], callee[1])
            if key not in self.edges:
                self.edges[key] = ("stay" if room == caller[0] else "return" if room in self.rooms else "entry")
        self.rooms.add(room)

    def __enter__(self) -> Walk:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *_exc) -> None:
        sys.setprofile(self._previous)

    def summary(self) -> dict:
        kinds = list(self.edges.values())
        return {"rooms": len(self.rooms), "stays": kinds.count("stay"), "entries": kinds.count("entry"),
                "returns": kinds.count("return"),
                "return_edges": sorted(f"{a} -> {b}" for (a, b), k in self.edges.items() if k == "return")}
