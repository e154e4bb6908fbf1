"""The harness: code that drives, attacks and demonstrates the real node, and is never imported
by it.

- ``adversary``: the cheating nodes that tests, benchmarks and devnets put verifiers to the test
  with (``vrl node`` hands one to a node whose node.toml sets ``adversary``);
- ``devnet``: ``vrl devnet``, local networks of real ``vrl node`` processes, watched live;
- ``demo``: the ``./scripts/demo`` job;
- ``vectors``: the test vectors of ``specs/vectors/`` (``./scripts/make-vectors``).

It sits at the top of the stack with the CLI: it imports :mod:`vrl.node` and the layers below,
and no production module imports it except the CLI's harness commands
(``tests/test_layout.py`` checks that).
"""
