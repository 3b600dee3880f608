"""What the sandbox sends the grader, and how the grader reads it without trusting it.

A frame is an 8-byte length and a torch file (torch.save). The grader accepts a frame only if its length is at
most MAX_FRAME_BYTES (checked from the header, before the frame is read), it is a zip of at most MAX_MEMBERS
members, all stored, not compressed (no zip bomb), whose pickle is at most MAX_PICKLE_BYTES (unpickling costs the
grader tens of bytes per byte: a pickle of a million empty lists would exhaust it), loads it weights-only (no
code), and checks its shape against the four messages the sandbox sends, with every text, list, nesting level
and tensor bounded. Anything else, including any error while decoding, is "unreadable": the grader stops that
sandbox, and it costs the submission, never the grader.

    {"at": "cell 3" or an exercise}          where the sandbox is now
    {"cells": [...], "cell_cpu_seconds": [[index, seconds], ...], "flags": [...]}
    {"result": name, "entry": {"defined": bool, "cases": [case, ...]}, "flags": [...]}
    {"done": True}
"""
from __future__ import annotations

import io
import struct
import zipfile

import torch

FRAME_HEADER = struct.Struct(">Q")
MAX_TEXT = 1000               # characters in one text
MAX_ITEMS = 2000              # items in one list
MAX_DEPTH = 6                 # nesting of a returned value
MAX_NODES = 200_000           # values visited in one frame (shared sub-lists count each time they are reached)
MAX_ELEMENTS = 64 * 2**20     # tensor elements in one frame (a stride-0 view counts its full size)
MAX_FRAME_BYTES = 64 * 2**20  # one frame, as its header announces it
MAX_PICKLE_BYTES = 4 * 2**20  # the frame's pickle (its structure; tensor data are members of their own)
MAX_MEMBERS = 20_000          # members of the frame's zip (one per tensor storage)
UNREADABLE = {"unreadable": True}
CASE_KEYS = {"value", "raised", "torch_calls", "cpu_seconds", "tampered"}


def _stored_zip(data: bytes) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except Exception:   # not a zip, or one zipfile refuses (an unknown version, a bad header): any reason
        return False
    pickles = [m for m in members if m.filename.endswith(".pkl")]
    return (len(members) <= MAX_MEMBERS and all(m.compress_type == zipfile.ZIP_STORED for m in members)
            and sum(m.file_size for m in members) <= len(data)
            and all(m.file_size <= MAX_PICKLE_BYTES for m in pickles))


class _Budget:
    def __init__(self):
        self.nodes, self.elements = 0, 0

    def spend(self, elements: int = 0) -> bool:
        self.nodes += 1
        self.elements += elements
        return self.nodes <= MAX_NODES and self.elements <= MAX_ELEMENTS


def _text(value, budget: _Budget) -> bool:
    return type(value) is str and len(value) <= MAX_TEXT and budget.spend()


def _texts(value, budget: _Budget) -> bool:
    return type(value) is list and len(value) <= MAX_ITEMS and all(_text(v, budget) for v in value)


def _number(value, budget: _Budget) -> bool:
    return type(value) in (int, float) and budget.spend()


def _value(value, budget: _Budget, depth: int = 0) -> bool:
    """A returned value as the sandbox makes it plain: a dense tensor, None, a bool, number or text, or a list,
    tuple or dict (text or integer keys) of them."""
    if type(value) is torch.Tensor:
        return value.layout == torch.strided and budget.spend(value.numel())
    if value is None or type(value) in (bool, int, float):
        return budget.spend()
    if type(value) is str:
        return _text(value, budget)
    if depth >= MAX_DEPTH or not budget.spend():
        return False
    if type(value) in (list, tuple):
        return len(value) <= MAX_ITEMS and all(_value(v, budget, depth + 1) for v in value)
    if type(value) is dict:
        return len(value) <= MAX_ITEMS and all(type(k) in (str, int) and _value(v, budget, depth + 1)
                                               for k, v in value.items())
    return False


def _case(case, budget: _Budget) -> bool:
    if type(case) is not dict or set(case) != CASE_KEYS:
        return False
    raised = case["raised"]
    return (_value(case["value"], budget) and _texts(case["torch_calls"], budget) and
            _number(case["cpu_seconds"], budget) and _texts(case["tampered"], budget) and
            (raised is None or type(raised) is dict and set(raised) == {"type", "message"}
             and _text(raised["type"], budget) and _text(raised["message"], budget)))


def valid(message) -> bool:
    """Whether `message` has the shape of one the sandbox sends, within the bounds above."""
    budget = _Budget()
    if type(message) is not dict:
        return False
    keys = set(message)
    if keys == {"at"}:
        return _text(message["at"], budget)
    if keys == {"done"}:
        return message["done"] is True
    if keys == {"cells", "cell_cpu_seconds", "flags"}:
        cpu = message["cell_cpu_seconds"]
        return (_texts(message["cells"], budget) and _texts(message["flags"], budget) and type(cpu) is list
                and len(cpu) <= MAX_ITEMS and all(type(c) is list and len(c) == 2 and type(c[0]) is int
                                                  and _number(c[1], budget) for c in cpu))
    if keys == {"result", "entry", "flags"}:
        entry = message["entry"]
        return (_text(message["result"], budget) and _texts(message["flags"], budget) and type(entry) is dict
                and set(entry) == {"defined", "cases"} and type(entry["defined"]) is bool
                and type(entry["cases"]) is list and len(entry["cases"]) <= MAX_ITEMS
                and all(_case(c, budget) for c in entry["cases"]))
    return False


def read(data: bytes):
    """One frame's message, or UNREADABLE."""
    if not _stored_zip(data):
        return UNREADABLE
    try:
        message = torch.load(io.BytesIO(data), weights_only=True)
    except Exception:   # bytes the submission wrote into the pipe itself
        return UNREADABLE
    return message if valid(message) else UNREADABLE


def frames(buffer: bytearray) -> list:
    """The complete frames at the start of `buffer` (removed from it), read. A header announcing more than
    MAX_FRAME_BYTES is UNREADABLE at once (the buffer is emptied: nothing after it can be framed)."""
    messages = []
    while len(buffer) >= FRAME_HEADER.size:
        (size,) = FRAME_HEADER.unpack_from(buffer)
        if size > MAX_FRAME_BYTES:
            buffer.clear()
            messages.append(UNREADABLE)
            break
        if len(buffer) < FRAME_HEADER.size + size:
            break
        data = bytes(buffer[FRAME_HEADER.size:FRAME_HEADER.size + size])
        del buffer[:FRAME_HEADER.size + size]
        messages.append(read(data))
    return messages
