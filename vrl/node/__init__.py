"""The network node: the sans-I/O protocol state machine (``protocol``, with ``events`` and the
``steps`` sub-machine), its messages, the reputation that weighs verdicts (``reputation``), the
SQLite store, the model work a node does, the daemon around them and the collaborators it
wires (``validation``, ``groups``, ``blobs``, ``catchup``, ``proving``, ``training``,
``startup``), its config, metrics, weights blobs and the devnet runner. It
builds on :mod:`vrl.rl`, :mod:`vrl.rollouts` and :mod:`vrl.tasks`, and on the transports of
:mod:`p2p`.
"""
