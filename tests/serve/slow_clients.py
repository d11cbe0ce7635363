"""Slow clients for the connection-guard test, run as a process of their own so that the server's process does
not share its GIL with them: ``python -m serve.slow_clients PORT N DURATION_S STUCK_S`` keeps N connections
trickling a request (a third their headers, a third their body, a third nothing) for DURATION_S seconds: each
one that the server closes or refuses is opened again half a second later, so the attack lasts DURATION_S
however fast the server sheds it. It prints, as one JSON line, how many connections the server closed
(``closed``), refused with a 503 (``refused``) or left open for STUCK_S seconds (``open``)."""

from __future__ import annotations

import asyncio
import json
import sys
import time

HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 400\r\n"
REOPEN_S = 0.5


async def one(port: int, kind: int, stuck_s: float) -> str:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return "refused"
    try:
        if kind == 1:
            writer.write(HEAD + b"\r\n{")
        end = time.monotonic() + stuck_s
        while time.monotonic() < end:
            if kind != 2:
                writer.write(b"x" if kind == 0 else b" ")
            try:
                data = await asyncio.wait_for(reader.read(4096), 0.25)
            except asyncio.TimeoutError:
                continue
            return "refused" if data.startswith(b"HTTP/1.1 503") else "closed"
        return "open"
    except (ConnectionError, OSError):
        return "closed"
    finally:
        writer.close()


async def slot(port: int, i: int, until: float, stuck_s: float) -> list[str]:
    outcomes = []
    while time.monotonic() < until:
        outcomes.append(await one(port, i % 3, stuck_s))
        await asyncio.sleep(REOPEN_S)
    return outcomes


async def main(port: int, n: int, duration_s: float, stuck_s: float) -> dict[str, int]:
    until = time.monotonic() + duration_s
    results = [o for s in await asyncio.gather(*(slot(port, i, until, stuck_s) for i in range(n))) for o in s]
    return {k: results.count(k) for k in ("closed", "refused", "open")}


if __name__ == "__main__":
    port, n, duration_s, stuck_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    print(json.dumps(asyncio.run(main(port, n, duration_s, stuck_s))), flush=True)
