"""One rank's snapshot as bytes: a header (JSON) and the tensors' raw bytes, the form a
snapshot takes in host memory, in its file and on the wire to a peer.

    MAGIC (8 bytes) | header length (8 bytes, little endian) | header (UTF-8 JSON)
    | zero padding to a multiple of 64 | data (the tensors, each at a 64-byte aligned offset)

The header holds what restores the rest of the run's state (the trainer state, the generator
states, the optimizer's non-tensor entries), what the restore checks (shard, step, world,
layout, each tensor's name, dtype, shape and offset) and a CRC-32 of the data: a replica
travels between nodes and sits in memory for hours, and a restore must not load what it
cannot vouch for.

Why not ``torch.save``: loading a pickle runs code, and a snapshot's tensors are read as views
of one buffer (no copy, no per-tensor allocation); the layout is fixed by the state's
names and shapes, so the staging buffer is allocated once and reused for every snapshot.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass

import torch

__all__ = ["ALIGN", "FORMAT", "MAGIC", "PREFIX_SIZE", "ShardHeader", "TensorSlot", "crc32",
           "decode_header", "encode_header", "header_end", "plan_slots", "tensor_views"]

MAGIC = b"BLSNAP\x00\x01"
FORMAT = 1
ALIGN = 64  # a slot's offset: aligned for any dtype's view (and for vector copies)
_PREFIX = struct.Struct("<8sQ")
PREFIX_SIZE = _PREFIX.size  # magic and the header's length
_DTYPES = {str(d): d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                               torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                               torch.bool)}


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lies in the data: its name, dtype, shape and byte offset."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _DTYPES[self.dtype].itemsize


@dataclass
class ShardHeader:
    """What a snapshot file says about itself (see the module docstring)."""

    shard: int
    step: int
    timeline: int  # the run's rollbacks so far: a snapshot of a rolled-back timeline is stale
    world_size: int
    layout: str
    created: float
    data_bytes: int
    data_crc: int
    slots: list[TensorSlot]
    values: dict
    trainer_state: dict
    rng: dict

    def to_json(self) -> dict:
        return {"format": FORMAT, "shard": self.shard, "step": self.step,
                "timeline": self.timeline, "world_size": self.world_size,
                "layout": self.layout, "created": self.created,
                "data_bytes": self.data_bytes, "data_crc": self.data_crc,
                "slots": [[s.name, s.dtype, list(s.shape), s.offset] for s in self.slots],
                "values": self.values, "trainer_state": self.trainer_state, "rng": self.rng}

    @classmethod
    def from_json(cls, obj: dict) -> ShardHeader:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"not a snapshot header of format {FORMAT}")
        slots = []
        for name, dtype, shape, offset in obj["slots"]:
            if dtype not in _DTYPES or offset % ALIGN or offset < 0:
                raise ValueError(f"slot {name}: dtype {dtype} at offset {offset}")
            slots.append(TensorSlot(name, dtype, tuple(int(n) for n in shape), int(offset)))
        header = cls(int(obj["shard"]), int(obj["step"]), int(obj["timeline"]),
                     int(obj["world_size"]), str(obj["layout"]), float(obj["created"]),
                     int(obj["data_bytes"]), int(obj["data_crc"]), slots, obj["values"],
                     obj["trainer_state"], obj["rng"])
        end = max((s.offset + s.nbytes for s in slots), default=0)
        if end > header.data_bytes:
            raise ValueError(f"slots end at byte {end}, past the data's {header.data_bytes}")
        return header


def plan_slots(tensors: dict[str, torch.Tensor]) -> tuple[list[TensorSlot], int]:
    """Slots for ``tensors`` in name order, each at an aligned offset; and the data's size."""
    slots, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        slot = TensorSlot(name, str(t.dtype), tuple(t.shape), offset)
        slots.append(slot)
        offset += -(-slot.nbytes // ALIGN) * ALIGN
    return slots, offset


def tensor_views(data: torch.Tensor, slots: list[TensorSlot]) -> dict[str, torch.Tensor]:
    """Each slot as a tensor viewing ``data`` (a flat uint8 tensor): no copy."""
    return {s.name: data[s.offset:s.offset + s.nbytes].view(_DTYPES[s.dtype]).view(s.shape)
            for s in slots}


def crc32(data: torch.Tensor) -> int:
    """CRC-32 of a flat uint8 CPU tensor's bytes (zlib releases the GIL while it runs)."""
    return zlib.crc32(memoryview(data.numpy())) if data.numel() else 0


def encode_header(header: ShardHeader) -> bytes:
    """The bytes before the data: magic, length, JSON, padding to the alignment."""
    body = json.dumps(header.to_json(), separators=(",", ":")).encode()
    head = _PREFIX.pack(MAGIC, len(body)) + body
    return head + b"\0" * (-len(head) % ALIGN)


def header_end(prefix: bytes) -> int:
    """Where the header's JSON ends, from a file's first ``PREFIX_SIZE`` bytes (what a reader
    must have read before ``decode_header``).

    Raises:
        ValueError: Not a snapshot (too short, or another magic).
    """
    if len(prefix) < _PREFIX.size:
        raise ValueError("shorter than a snapshot header")
    magic, length = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise ValueError("not a bloomline snapshot (bad magic)")
    return _PREFIX.size + length


def decode_header(prefix: bytes) -> tuple[ShardHeader, int]:
    """(header, data offset) from a file's first bytes (at least the whole header).

    Raises:
        ValueError: Not a snapshot, a truncated header, or fields that do not check out.
    """
    end = header_end(prefix)
    if len(prefix) < end:
        raise ValueError("truncated header")
    try:
        obj = json.loads(prefix[_PREFIX.size:end])
        header = ShardHeader.from_json(obj)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"bad header ({err})") from None
    return header, end + (-end % ALIGN)
