#!/usr/bin/env python3
"""A memcached proxy on loopback that delays or holds chosen replies, for fault tests.

    mcproxy.py LISTEN_PORT MEMCACHED_PORT DELAY_MS|never OPCODES

Forwards every byte between clients and memcached, and holds back each
binary-protocol reply whose opcode is in OPCODES (comma-separated, e.g.
"1" for SET) by DELAY_MS, or for good with "never" (the connection stays
open, so the client sees a timeout, whatever its length).  The server has
applied the request by then; a client with a shorter poll timeout sees a
timeout for a request that succeeded.  Prints "listening" once it accepts
connections and "held OPCODE" for each reply it holds (after the server
applied the request), so that a test can wait on them instead of on time.
Stops by itself after 10 minutes.
"""
import asyncio
import sys

LISTEN, TARGET = int(sys.argv[1]), int(sys.argv[2])
DELAY = None if sys.argv[3] == "never" else int(sys.argv[3]) / 1000.0
OPCODES = {int(x) for x in sys.argv[4].split(",")}
HEADER = 24


def note(line):
    print(line, flush=True)


async def pump(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def replies(reader, writer):
    """Forward the server's replies one by one, delaying the chosen ones."""
    try:
        while True:
            header = await reader.readexactly(HEADER)
            body = await reader.readexactly(int.from_bytes(header[8:12], "big"))
            if header[0] == 0x81 and header[1] in OPCODES:
                note(f"held {header[1]}")
                if DELAY is None:
                    await asyncio.Event().wait()    # until the client leaves
                await asyncio.sleep(DELAY)
            writer.write(header + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def handle(client_reader, client_writer):
    try:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", TARGET)
    except OSError:
        client_writer.close()
        return
    back = asyncio.ensure_future(replies(server_reader, client_writer))
    # once the client has gone, nobody waits for a reply still held
    await pump(client_reader, server_writer)
    back.cancel()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", LISTEN)
    note("listening")
    async with server:
        await asyncio.sleep(600)


asyncio.run(main())
