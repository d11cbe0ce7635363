"""Slow clients for the connection-guard test, run as a process of their own so that the server's process does
not share its GIL with them: ``python -m serve.slow_clients PORT N HOLD_S`` opens N connections that trickle a
request (a third their headers, a third their body, a third nothing) for up to HOLD_S seconds and prints how many
the server closed (``closed``), refused with a 503 (``refused``) or left open, as one JSON line."""

from __future__ import annotations

import asyncio
import json
import sys
import time

HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 400\r\n"


async def one(port: int, i: int, hold_s: float) -> str:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return "refused"
    kind = i % 3
    try:
        if kind == 1:
            writer.write(HEAD + b"\r\n{")
        end = time.monotonic() + hold_s
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


async def main(port: int, n: int, hold_s: float) -> dict[str, int]:
    results = await asyncio.gather(*(one(port, i, hold_s) for i in range(n)))
    return {k: results.count(k) for k in ("closed", "refused", "open")}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))), flush=True)
