"""Running one node as a process: ``vrl node --config node.toml``."""

from __future__ import annotations

import asyncio
import re
import signal

import structlog

from p2p.transport import Transport
from vrl.keys import NodeKey
from vrl.node.config import ConfigError, NodeConfig
from vrl.node.daemon import Node

_LISTEN = re.compile(r"^/ip4/(?P<host>[0-9.]+)/tcp/(?P<port>\d+)$")


def node_key(config: NodeConfig) -> NodeKey:
    """The node's key, created on first start (its id is its identity on every network)."""
    path = config.path / config.key
    if not path.exists():
        config.path.mkdir(parents=True, exist_ok=True)
        NodeKey.generate().save(path)
    return NodeKey.load(path)


def open_transport(config: NodeConfig, key: NodeKey) -> Transport:
    match = _LISTEN.match(config.listen)
    if match is None:
        raise ConfigError(f"listen: expected /ip4/<address>/tcp/<port>, got {config.listen!r}")
    from p2p.libp2p_transport import Libp2pTransport  # imports ~1,300 modules: only when needed

    return Libp2pTransport(key.private_seed(), host=match["host"], port=int(match["port"]))


async def serve(config: NodeConfig) -> None:
    """Run until SIGINT or SIGTERM, then shut down cleanly (the store is always consistent)."""
    key = node_key(config)
    transport = open_transport(config, key)
    log = structlog.get_logger("vrl.node")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await transport.start()
    node = Node(config, transport, key, log)
    log.info("node started", id=key.node_id.hex(), roles=list(config.roles), addresses=transport.addresses(),
             adversary=config.adversary or None)
    try:
        await node.run(stop)
    finally:
        await transport.close()
        log.info("node stopped")
