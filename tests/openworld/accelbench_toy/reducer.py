"""The toy engine's all-reduce: one reducer process averages the gradients of every worker.

A worker sends its gradients as one float64 buffer (8-byte length first) and receives the mean
of all workers'. The reducer binds only the address the engine gave it (loopback for local runs).
"""

from __future__ import annotations

import os
import socket
import struct
import time

import numpy as np

CONNECT_TIMEOUT_S = 60.0


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack("!Q", len(payload)) + payload)


def _receive(sock: socket.socket) -> bytes | None:
    header = _exactly(sock, 8)
    return None if header is None else _exactly(sock, struct.unpack("!Q", header)[0])


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(min(size - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _address() -> tuple[str, int]:
    host, _, port = os.environ["TOY_REDUCER"].rpartition(":")
    return host, int(port)


def serve_from_environment() -> None:
    """Average rounds of gradients from TOY_WORLD workers until they all disconnect."""
    world = int(os.environ["TOY_WORLD"])
    with socket.create_server(_address()) as server:
        peers = [server.accept()[0] for _ in range(world)]
    while True:
        buffers = [_receive(peer) for peer in peers]
        if any(b is None for b in buffers):
            break
        mean = sum(np.frombuffer(b, dtype=np.float64) for b in buffers) / world
        for peer in peers:
            _send(peer, mean.tobytes())
    for peer in peers:
        peer.close()


class Link:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    def average(self, grads: list[np.ndarray]) -> list[np.ndarray]:
        flat = np.concatenate([g.astype(np.float64).ravel() for g in grads])
        _send(self.sock, flat.tobytes())
        reply = _receive(self.sock)
        if reply is None:
            raise ConnectionError("the reducer went away")
        mean, out, start = np.frombuffer(reply, dtype=np.float64), [], 0
        for g in grads:
            out.append(mean[start : start + g.size].reshape(g.shape))
            start += g.size
        return out

    def close(self) -> None:
        self.sock.close()


def connect_from_environment() -> Link | None:
    """A link to the reducer in a multi-worker run (None alone); waits for it to start listening."""
    if "TOY_REDUCER" not in os.environ:
        return None
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            return Link(socket.create_connection(_address(), timeout=CONNECT_TIMEOUT_S))
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
