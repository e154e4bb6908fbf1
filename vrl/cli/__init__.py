"""The ``vrl`` command line, one module per family of commands:

- :mod:`vrl.cli.rollouts`: keygen, generate, verify, inspect;
- :mod:`vrl.cli.zk`: commit-answers, prove, evaluate;
- :mod:`vrl.cli.training`: train, export, build-base-model;
- :mod:`vrl.cli.network`: node, devnet, reputation;
- :mod:`vrl.cli.auditing`: audit.

No module bears a command's name: ``vrl.cli.audit``, ``vrl.cli.verify``... are the commands'
functions, as they were when the CLI was one module.

What they share (the app, logging, the error line, the options several declare) is
:mod:`vrl.cli.common`. What a command reports the library computes (verify's: each producer's
sequential test, :func:`vrl.rollouts.verify.producer_tests`; what the proofs show,
:mod:`vrl.zk.summary`); the command formats it. It imports the library when it runs: ``vrl
--help`` starts without torch (bench/cli_startup.py).

Exit codes of ``verify``: 0 every rollout accepted, 1 any rejected, 2 unusable input. Of
``audit``: 0 a clean audit, 1 findings, 2 unusable input.
"""

# The families register their commands on `app` as they are imported: in this order, the order
# `vrl --help` lists them in (not the alphabetical one isort would give).
# isort: off
from vrl.cli.common import app, configure_logging
from vrl.cli.rollouts import generate, inspect, keygen, verify
from vrl.cli.zk import commit_answers_command, evaluate, prove
from vrl.cli.training import build_base_model_command, export, train
from vrl.cli.network import devnet, node, reputation
from vrl.cli.auditing import audit
from vrl.rollouts.tables import verdict_table
# isort: on

__all__ = [
    "app", "audit", "build_base_model_command", "commit_answers_command", "configure_logging", "devnet", "evaluate",
    "export", "generate", "inspect", "keygen", "node", "prove", "reputation", "train", "verdict_table", "verify",
]
