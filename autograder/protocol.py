"""The parent <-> child wire protocol: length-prefixed JSON headers plus raw ``.npy`` payloads.

Never pickle (T4): arrays are written with ``np.save(allow_pickle=False)`` and read with
``np.load(allow_pickle=False)``; everything else is JSON. A frame is

    4-byte big-endian header length | JSON header | payload bytes (lengths listed in header["_payload"])

The parent reads with deadlines and size limits (a child that floods, stalls or writes garbage is treated as
crashed, never trusted); the child uses plain blocking I/O.
"""
from __future__ import annotations

import io
import json
import os
import select
import struct
import time

import numpy as np

MAX_HEADER = 4 << 20
MAX_PAYLOAD = 1 << 30


class ChannelClosed(Exception):
    """The other side closed its end (process died or closed the pipe)."""


class ChannelTimeout(Exception):
    """No complete message before the deadline."""


class ProtocolError(Exception):
    """The other side sent something that is not a valid frame."""


def encode_array(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def decode_array(b: bytes) -> np.ndarray:
    try:
        return np.load(io.BytesIO(b), allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 -- any malformed payload is a protocol error
        raise ProtocolError(f"payload is not a plain .npy array: {exc}") from None


def pack(header: dict, arrays=None) -> bytes:
    """One frame; ``arrays`` is a dict name -> ndarray (None values are sent as absent)."""
    payloads, names = [], []
    for name, a in (arrays or {}).items():
        if a is None:
            continue
        b = encode_array(a)
        payloads.append(b)
        names.append([name, len(b)])
    h = dict(header, _payload=names)
    hb = json.dumps(h, allow_nan=True).encode()
    return struct.pack(">I", len(hb)) + hb + b"".join(payloads)


def _unpack_header(hb: bytes):
    try:
        h = json.loads(hb.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(h, dict) or not isinstance(h.get("_payload", []), list):
        raise ProtocolError("header must be a JSON object")
    sizes = []
    for item in h.get("_payload", []):
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
                or not isinstance(item[1], int) or item[1] < 0):
            raise ProtocolError("bad payload table")
        sizes.append(item)
    if sum(s for _, s in sizes) > MAX_PAYLOAD:
        raise ProtocolError("payload too large")
    return h, sizes


class ParentChannel:
    """Parent side: non-blocking reads and writes with deadlines."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        self.buf = bytearray()
        self.on_wait = None           # called while waiting (e.g. the RSS watchdog); may raise

    def close(self):
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass

    def send(self, header, arrays=None, timeout=30.0):
        data = memoryview(pack(header, arrays))
        deadline = time.monotonic() + timeout
        while data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout("child did not read its input in time")
            _, w, _ = select.select([], [self.wfd], [], min(left, 0.2))
            if self.on_wait:
                self.on_wait()
            if not w:
                continue
            try:
                n = os.write(self.wfd, data[:1 << 20])
            except BrokenPipeError:
                raise ChannelClosed("child closed its input pipe") from None
            except BlockingIOError:
                continue
            data = data[n:]

    def _fill(self, need: int, deadline: float):
        while len(self.buf) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout("no answer before the deadline")
            r, _, _ = select.select([self.rfd], [], [], min(left, 0.2))
            if self.on_wait:
                self.on_wait()
            if not r:
                continue
            try:
                chunk = os.read(self.rfd, max(need - len(self.buf), 1 << 16))
            except BlockingIOError:
                continue
            if not chunk:
                raise ChannelClosed("child closed its output pipe (it exited or was killed)")
            self.buf += chunk

    def _take(self, n: int) -> bytes:
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def recv(self, timeout: float):
        """``(header, arrays)`` of the next frame, or raise ChannelTimeout/ChannelClosed/ProtocolError."""
        deadline = time.monotonic() + timeout
        self._fill(4, deadline)
        (n,) = struct.unpack(">I", bytes(self.buf[:4]))
        if n > MAX_HEADER:
            raise ProtocolError("header too large")
        self._fill(4 + n, deadline)
        self._take(4)
        h, sizes = _unpack_header(self._take(n))
        arrays = {}
        for name, size in sizes:
            self._fill(size, deadline)
            arrays[name] = decode_array(self._take(size))
        return h, arrays


class ChildChannel:
    """Child side: blocking I/O on the two inherited descriptors."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = os.read(self.rfd, n - len(out))
            if not chunk:
                raise ChannelClosed("parent closed the pipe")
            out += chunk
        return bytes(out)

    def recv(self):
        (n,) = struct.unpack(">I", self._read(4))
        h, sizes = _unpack_header(self._read(n))
        return h, {name: decode_array(self._read(size)) for name, size in sizes}

    def send(self, header, arrays=None):
        data = memoryview(pack(header, arrays))
        while data:
            data = data[os.write(self.wfd, data):]
