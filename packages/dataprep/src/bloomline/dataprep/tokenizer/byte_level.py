"""The byte-level alphabet of GPT-2-style BPE (BLOOM, GPT-2, Llama 3): how its pieces spell
bytes, and back.

Byte-level BPE works on UTF-8 bytes and writes each of the 256 byte values as one printable
character, so that a vocabulary entry is a string: the printable ASCII and Latin-1 bytes stand
for themselves, the other 68 (controls, space, a few Latin-1 ones) for the characters from
U+0100 on, in byte order. A space is ``Ġ`` and 的 (UTF-8 ``e7 9a 84``) is ``çļĦ``.
"""

from __future__ import annotations

__all__ = ["BYTE_OF_CHAR", "CHAR_OF_BYTE", "piece_bytes"]


def _alphabet() -> dict[int, str]:
    shown_as_is = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                   *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {byte: chr(byte) for byte in shown_as_is}
    others = (byte for byte in range(256) if byte not in alphabet)
    alphabet.update({byte: chr(256 + n) for n, byte in enumerate(others)})
    return alphabet


CHAR_OF_BYTE: dict[int, str] = _alphabet()
"""Byte value -> the character a byte-level piece writes it as."""
BYTE_OF_CHAR: dict[str, int] = {char: byte for byte, char in CHAR_OF_BYTE.items()}
"""The inverse: a byte-level piece's character -> the byte it stands for."""


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a byte-level piece stands for (``Ġthe`` -> ``b" the"``), or None when a
    character of it is outside the alphabet (an added token such as ``<|endoftext|>`` is
    spelled in it too, as its own ASCII)."""
    try:
        return bytes(BYTE_OF_CHAR[char] for char in piece)
    except KeyError:
        return None
