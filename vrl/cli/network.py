"""The network: ``vrl node``, ``devnet`` and ``reputation``."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from vrl.cli.common import JsonOption, app, configure_logging, err, fail, out
from vrl.errors import VrlError


@app.command()
def node(
    config_path: Annotated[Path, typer.Option("--config", help="node.toml (see README: roles, listen, bootstrap...)")],
    json_logs: Annotated[bool, typer.Option("--json", help="JSON log lines (structlog) instead of console "
                                                           "logs.")] = False,
) -> None:
    """Run a node daemon until SIGINT/SIGTERM: worker, verifier and/or trainer on a libp2p network."""
    from vrl.node.config import ConfigError, NodeConfig
    from vrl.node.run import serve

    # Each error is one line however wide (fail's soft_wrap), and a value quoted in it is never read as markup.
    configure_logging(json_logs, level=logging.INFO)
    try:
        config = NodeConfig.from_toml(config_path)
    except ConfigError as error:  # names the file and the key
        raise fail(str(error)) from None
    try:
        build = None
        if config.adversary:  # a devnet's cheat: the harness builds it, and is loaded only then
            from vrl.harness.adversary import node_for

            build = node_for(config.adversary)
        asyncio.run(serve(config, build))
    except ConfigError as error:  # what only the start finds, named by key
        raise fail(f"{config_path}: {error}") from None
    except VrlError as error:  # a checkpoint, store, key or model: these name their file
        raise fail(str(error)) from None


@app.command()
def devnet(
    nodes: Annotated[int, typer.Option(min=2, help="Node processes; node 0 trains, the rest work and verify.")] = 4,
    adversaries: Annotated[str, typer.Option(help="Comma-separated cheats for the last nodes: "
                                             "fabricated-reward, quantized-model, other-model, tampered-tokens, "
                                             "replay, lazy-verifier; and at most one for the trainer (node 0): "
                                             "trainer-rejected-group, trainer-foreign-data, trainer-drops-node, "
                                             "trainer-learning-rate, trainer-fake-weights, "
                                             "trainer-inflated-rewards (with --answers).")] = "",
    rounds: Annotated[int, typer.Option(min=1, help="Stop after the trainer has published this many versions.")] = 6,
    model: Annotated[str, typer.Option(help="Model every node builds its skeleton from (weights come from the "
                                            "trainer).")] = "base",
    task: Annotated[str, typer.Option()] = "arithmetic:digits=2,ops=+",
    directory: Annotated[Path | None, typer.Option("--dir", help="Node directories (default: a new temp dir).")] = None,
    base_port: Annotated[int, typer.Option(help="libp2p ports start here, metrics ports at +1000; keep both "
                                           "below the ephemeral range (32768+), which outgoing dials use.")] = 29000,
    deadline: Annotated[float, typer.Option(help="Stop after this many seconds whatever happened.")] = 900.0,
    plant_every: Annotated[int, typer.Option(help="The trainer plants a known-bad group every N rounds "
                                                  "(0: never).")] = 2,
    verification: Annotated[str | None, typer.Option(help="Which groups a verifier checks: committee (VRF "
                                                          "committees of the trainer's round manifests, "
                                                          "specs/committee.md; a node's default) or tickets "
                                                          "(every group at its producer's check rate).")] = None,
    answers: Annotated[Path | None, typer.Option(help="Private tasks: --task is a public file of committed "
                                                    "references and this its answer key, which only the trainer "
                                                    "gets; it proves every trained record's reward.")] = None,
    srs: Annotated[Path | None, typer.Option(help="With --answers: the network's public KZG SRS file.")] = None,
    dev_srs: Annotated[bool, typer.Option(help="With --answers: a single-party test SRS (INSECURE).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Start N real node processes on 127.0.0.1, show them live, stop after ROUNDS policy versions.

    Exits 1, saying why, when a node dies, the nodes cannot reach each other, or the network
    never gets past policy version 0."""
    import tempfile

    from vrl.harness import devnet as dn
    from vrl.node.params import ProtocolParams, Verification

    configure_logging(False)
    if verification is None:
        verification = ProtocolParams.verification
    elif verification not in {v.value for v in Verification}:
        raise fail(f"--verification: one of {', '.join(Verification)}, got {verification!r}")
    kinds = [k for k in adversaries.split(",") if k]
    if model == "base":
        from vrl.rl.base_model import ensure_base_model

        ensure_base_model()
    zk: dict[str, str | bool] = {}
    if answers is not None:  # specs/zk.md §11: the key goes to the trainer's node.toml only (dn.plan)
        if (srs is None) == (not dev_srs):
            raise fail("--answers needs the network's SRS: --srs PATH, or --dev-srs (INSECURE)")
        zk = {"answers": str(answers), **({"srs": str(srs)} if srs is not None else {"dev_srs": True})}
    elif srs is not None or dev_srs:
        raise fail("--srs and --dev-srs are for a network of private tasks: give --answers too")
    extra: dict[str, Any] = {"zk": zk} if zk else {}  # node.toml tables: zk only when asked for
    directory = directory or Path(tempfile.mkdtemp(prefix="vrl-devnet-"))  # resolved once, by dn.plan
    try:
        summary = dn.run(directory, nodes, kinds, rounds, deadline, base_port, err,
                         work={"model": model, "task": task},
                         protocol={"plant_every": plant_every, "verification": verification},
                         **extra)
    except ValueError as error:
        raise fail(str(error)) from None
    if json_out:
        out.print_json(json.dumps(summary, default=str))
    else:
        out.print(f"devnet finished: {dn.outcome_line(summary)}", highlight=False)
    if summary["failure"]:  # a network that did nothing is not a success
        raise fail(f"devnet failed: {summary['failure']}", code=1)


@app.command()
def reputation(
    store_path: Annotated[Path, typer.Argument(help="A node's node.sqlite.")],
    trust: Annotated[list[str], typer.Option(help="Hex node ids to pre-trust (the node itself, its trainer...).")],
    at_round: Annotated[int | None, typer.Option("--round", help="Evaluate as of this round (default: "
                                                                 "newest).")] = None,
    json_out: JsonOption = False,
) -> None:
    """Recompute every node's reputation from the signed verdicts in a store, as an auditor would."""
    from vrl.node.reputation import recompute
    from vrl.node.store import Store, StoreError

    try:
        store = Store(store_path) if store_path.exists() else None
    except StoreError as error:
        raise fail(str(error)) from None
    if store is None:
        raise fail(f"{store_path}: no such store")
    try:
        anchors = frozenset(bytes.fromhex(t) for t in trust)
    except ValueError:
        raise fail("--trust takes hex node ids") from None
    try:
        found = recompute(store.replay(), anchors, at_round)
    finally:
        store.close()
    ranked = found.ranked()
    if json_out:
        rows = [{"node": n.hex(), "score": s.score, "check_rate": s.check_rate, "quarantined": s.quarantined,
                 "trust": s.trust, "checked_groups": s.checked_groups} for n, s in ranked]
        out.print_json(json.dumps({"invalid_verdicts": found.invalid_verdicts, "nodes": rows}))
        return
    table = Table(title=f"reputation recomputed from {found.reports} reports ({found.invalid_verdicts} invalid "
                        "verdicts skipped)", title_justify="left")
    for column in ("node", "score", "check rate", "trust", "checked groups", "quarantined"):
        table.add_column(column, justify="left" if column == "node" else "right")
    for n, s in ranked:
        table.add_row(n.hex()[:16], f"{s.score:.3f}", f"{s.check_rate:.2f}", f"{s.trust:.2f}",
                      str(s.checked_groups), "[red]yes[/]" if s.quarantined else "no")
    out.print(table)
