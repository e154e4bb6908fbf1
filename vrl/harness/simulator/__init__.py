"""A discrete-event simulator of the vrl network at scale (issue 30): N real
:class:`vrl.node.protocol.NodeProtocol` state machines (protocol, reputation, admission and
conviction unchanged) in one process, on a simulated clock and network, with adversaries.

What is stubbed, and only this: the time verification costs (bench/cost.py's measured ms per
token), what a check finds (the adversary's ground truth; the calibrated honest rejection
rate), the time of the trainer's step and of its replays, and generation beyond its time
(records carry synthetic tokens of realistic size, signed for real). Modules: ``spec``
(settings, adversary specs, costs), ``network`` (links, gossipsub mesh, latency, faults),
``payloads`` (real messages, the ground truth), ``nodes`` (a simulated node, a gossiped
message), ``driver`` (the clock, the nodes, gossip and the inbox), ``actions`` (what each
protocol action does, its work charged in time), ``stores`` (what each store holds and
backfill pages), ``making`` (groups made ahead in other processes), ``metrics`` (what is
measured, in the calibration's definitions). ``bench/simulate.py`` is the command line.
"""

from .driver import Simulation
from .spec import ALL_ADVERSARIES, AdversarySpec, SimConfig, SpecError, parse_adversaries

__all__ = ["ALL_ADVERSARIES", "AdversarySpec", "SimConfig", "Simulation", "SpecError",
           "parse_adversaries"]
