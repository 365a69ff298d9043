"""Byte pipes between TCP and Unix sockets: how a pod's network reaches the host and back.

A pod started by tests/deploy/podrun.py lives in a network namespace of its own (loopback
only): it cannot reach the host's loopback, nor the host its. A Unix socket on the shared
file system crosses that boundary, so every connection goes TCP -> Unix socket -> TCP, one
half on each side (`Bridges` below runs both kinds on one event loop):

- into the pod (a probe, Alertmanager, a Service): host 127.0.0.1:<free port> -> Unix socket
  -> the pod's 127.0.0.1:<containerPort>;
- out of the pod (a Service's ClusterIP:port, e.g. the Kubernetes API or Temporal): the pod's
  <clusterIP>:<port> -> Unix socket -> the host's 127.0.0.1:<port> where the backend listens.

Bytes only: TLS, HTTP/2 (gRPC) and watches pass through untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
CHUNK = 65536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # a half-close travels on, as through kube-proxy
    except (ConnectionError, OSError):
        pass


async def _serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connect: Connect
) -> None:
    try:
        upstream_reader, upstream_writer = await connect()
    except OSError:
        writer.close()  # nothing listens there (yet): the client sees a reset, as in a cluster
        return
    try:
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
    finally:
        for w in (writer, upstream_writer):
            with contextlib.suppress(Exception):
                w.close()


def tcp(host: str, port: int) -> Connect:
    return lambda: asyncio.open_connection(host, port)


def unix(path: str) -> Connect:
    return lambda: asyncio.open_unix_connection(path)


async def listen_tcp(host: str, port: int, connect: Connect) -> asyncio.Server:
    return await asyncio.start_server(lambda r, w: _serve(r, w, connect), host, port)


async def listen_unix(path: str, connect: Connect) -> asyncio.Server:
    return await asyncio.start_unix_server(lambda r, w: _serve(r, w, connect), path)


class Bridges:
    """Host-side halves on an event loop of their own (a daemon thread), for sync tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def _run(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)  # type: ignore[arg-type]

    def into(self, socket_path: str) -> int:
        """A host 127.0.0.1 port whose connections go to the pod end of `socket_path`."""
        server = self._run(listen_tcp("127.0.0.1", 0, unix(socket_path)))
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    def out_of(self, socket_path: str, host: str, port: int) -> None:
        """Connections the pod makes to `socket_path` reach host:port on the host."""
        self._servers.append(self._run(listen_unix(socket_path, tcp(host, port))))

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                server.close()
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        with contextlib.suppress(Exception):
            self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
