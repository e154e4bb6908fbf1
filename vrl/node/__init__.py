"""The network node: the sans-I/O protocol state machine (``protocol``, with ``events`` and the
``steps`` sub-machine), its messages (``messages``, declared in the wire schema of ``wire``), the
reputation that weighs verdicts (``reputation``), the SQLite store, the model work a node does,
the daemon around them and the collaborators it wires (``validation``, ``groups``, ``blobs``,
``catchup``, ``proving``, ``training``, ``startup``), its config, metrics and weights blobs. It
builds on :mod:`vrl.rl`, :mod:`vrl.rollouts` and :mod:`vrl.tasks`, and on the transports of
:mod:`p2p`. Local devnets of node processes are harness (:mod:`vrl.harness.devnet`).
"""
