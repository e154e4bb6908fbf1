"""Running one node as a process: ``vrl node --config node.toml``.

What the config file cannot show by itself (a device this machine lacks, a task file or model
that is not there, a data_dir that cannot be created, a damaged key) is found when the node
starts and raised as a :class:`ConfigError` naming the table and the key, so the operator
gets one line.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from p2p.transport import Transport
from vrl.node.config import ConfigError, NodeConfig, listen_host_port
from vrl.rollouts.keys import KeyFileError, NodeKey

if TYPE_CHECKING:
    from vrl.node.daemon import Node

    # What makes a node from its config, transport, key and log: the honest Node, or a cheat's.
    Build = Callable[[NodeConfig, Transport, NodeKey, structlog.BoundLogger], Node]


def node_key(config: NodeConfig) -> NodeKey:
    """The node's key, created on first start (its id is its identity on every network)."""
    path = config.path / config.key
    try:
        if not path.exists():
            config.path.mkdir(parents=True, exist_ok=True)
            NodeKey.generate().save(path)
        return NodeKey.load(path)
    except (KeyFileError, OSError) as error:
        raise ConfigError(str(error), ("key",)) from None


def preflight(config: NodeConfig) -> None:
    """The cheap checks that need this machine, before anything starts."""
    from vrl.rollouts.model import ModelError, resolve_device

    try:
        config.path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"cannot use {config.path}: {error.strerror or error}", ("data_dir",)) from None
    try:
        resolve_device(config.work.device)
    except ModelError as error:
        raise ConfigError(str(error), ("work", "device")) from None
    task = config.work.task
    if not (task == "arithmetic" or task.startswith("arithmetic:")) and not Path(task).is_file():
        raise ConfigError(f"{task!r} is neither an arithmetic spec nor a task file", ("work", "task"))


def open_transport(config: NodeConfig, key: NodeKey) -> Transport:
    host, port = listen_host_port(config.listen)
    from p2p.libp2p_transport import Libp2pTransport  # imports ~1,300 modules: only when needed

    return Libp2pTransport(key.private_seed(), host=host, port=port,
                           limits=config.transport_limits)


def open_node(config: NodeConfig, transport: Transport, key: NodeKey, log: structlog.BoundLogger,
              build: Build | None = None) -> Node:
    """The node ``build`` makes (``build(config, transport, key, log)``; a
    :class:`~vrl.node.daemon.Node` when None), with what only loading finds wrong (the model,
    the task file) named by key."""
    from vrl.rollouts.model import ModelError
    from vrl.tasks import TaskFileError

    if build is None:
        from vrl.node.daemon import Node

        build = Node
    try:
        return build(config, transport, key, log)
    except ModelError as error:  # the device was checked by preflight: this is the model
        raise ConfigError(str(error), ("work", "model")) from None
    except TaskFileError as error:
        raise ConfigError(str(error), ("work", "task")) from None


async def serve(config: NodeConfig, build: Build | None = None) -> None:
    """Run until SIGINT or SIGTERM, then shut down cleanly (the store is always consistent).
    ``build`` makes the node (:func:`open_node`): an honest one by default, or a cheat's
    (``vrl.harness.adversary.node_for``)."""
    preflight(config)
    key = node_key(config)
    transport = open_transport(config, key)
    log = structlog.get_logger("vrl.node")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await transport.start()
    try:  # closed however the start ends: its network thread would keep the process alive
        node = open_node(config, transport, key, log, build)
        log.info("node started", id=key.node_id.hex(), roles=list(config.roles), addresses=transport.addresses(),
                 adversary=config.adversary or None)
        await node.run(stop)
    finally:
        await transport.close()
        log.info("node stopped")
