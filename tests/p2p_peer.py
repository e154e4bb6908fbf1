"""A Libp2pTransport in a process of its own, for tests/test_libp2p_hardening.py to SIGKILL,
SIGSTOP and restart. It answers "/echo", counts the messages of topic "t" (answering "/count"
with that number), prints its address once it listens, and exits by itself after --lifetime
seconds so that a failed test cannot leave it behind.

    python tests/p2p_peer.py --seed <64 hex> --port <port> [--lifetime 60]
"""

from __future__ import annotations

import argparse
import asyncio

from p2p.libp2p_transport import Libp2pTransport
from p2p.transport import Message


async def main(seed: bytes, port: int, lifetime: float) -> None:
    transport = Libp2pTransport(seed, port=port)
    received = 0

    async def echo(peer: bytes, data: bytes) -> bytes:
        return data

    async def count(peer: bytes, data: bytes) -> bytes:
        return b"%d" % received

    async def on_message(message: Message) -> None:
        nonlocal received
        received += 1

    transport.set_handler("/echo", echo)
    transport.set_handler("/count", count)
    transport.subscribe("t", on_message)
    await transport.start()
    print(transport.addresses()[0], flush=True)
    try:
        await asyncio.sleep(lifetime)
    finally:
        await transport.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lifetime", type=float, default=60.0)
    args = parser.parse_args()
    asyncio.run(main(bytes.fromhex(args.seed), args.port, args.lifetime))
