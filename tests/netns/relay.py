"""A unix-socket to TCP relay, run inside a lab namespace: the test's only way in.

The test process stays in the root namespace, where 10.x addresses route to the outside
and must never be dialled. It talks to the controller (gRPC Query, HTTP) through a unix
socket instead: unix sockets live in the file system, not in a network namespace, and
this relay, started inside the controller's namespace, forwards each connection to the
controller's address there.

    python -m tests.netns.relay --unix PATH --to HOST:PORT [--unix PATH --to HOST:PORT ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def _handler(host: str, port: int):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


async def main(pairs: list[tuple[str, str]]) -> None:
    servers = []
    for path, target in pairs:
        host, _, port = target.rpartition(":")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        servers.append(await asyncio.start_unix_server(_handler(host, int(port)), path=path))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("relay ready", flush=True)
    await stop.wait()
    for s in servers:
        s.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--unix", action="append", required=True)
    ap.add_argument("--to", action="append", required=True)
    ns = ap.parse_args()
    if len(ns.unix) != len(ns.to):
        ap.error("give one --to per --unix")
    asyncio.run(main(list(zip(ns.unix, ns.to, strict=True))))
