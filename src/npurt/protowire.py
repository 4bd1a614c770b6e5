"""The protobuf wire format, read over a buffer without protobuf: varints, tags, the fields of a message, groups,
UTF-8 text. Nothing here knows a schema; ``modelfile`` walks ONNX's messages with it.

Every read is bounded by the end of the message it is in: a truncated or malformed buffer is a ``ValueError`` naming
the byte, never an overrun. Nesting is bounded by ``MAX_DEPTH`` (protobuf's own default recursion limit).
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["EGROUP", "I32", "I64", "LEN", "MAX_DEPTH", "MAX_FIELD_NUMBER", "SGROUP", "VARINT", "Span", "field_tag",
           "fields", "int32", "int64", "skip_group", "text", "varint"]

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
MAX_FIELD_NUMBER = (1 << 29) - 1
MAX_DEPTH = 100  # nesting of subgraphs, types or groups; protobuf's own default recursion limit
U64 = (1 << 64) - 1

Span = tuple[int, int]  # [start, end) of a length-delimited payload


def varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` (at most 10 bytes, truncated to 64 bits) and the position after it."""
    if pos >= end:
        raise ValueError(f"truncated: a varint at byte {pos} runs past the end of its message (byte {end})")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    start = pos
    value = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise ValueError(f"truncated: a varint at byte {start} runs past the end of its message (byte {end})")
        if shift >= 70:
            raise ValueError(f"malformed: the varint at byte {start} is longer than 10 bytes")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & U64, pos
        shift += 7


def int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def field_tag(number: int, wire_type: int) -> int:
    return number << 3 | wire_type


def fields(buf: memoryview, pos: int, end: int, depth: int, wanted: frozenset[int]) -> Iterator[tuple[int, int, int]]:
    """The fields of the message in [pos, end) whose tag (number << 3 | wire type) is in ``wanted``: (tag, a, b).

    For a varint a is its value; for a length-delimited field [a, b) is its payload. Every field, wanted or not, is
    checked to fit in the message; a field with another wire type than the one wanted is an unknown field to protobuf,
    and skipped here like one.
    """
    # The one-byte varints (tags of fields 1-15, lengths and values below 128) are read inline and fields nobody asked
    # for are not yielded: this loop is the hot path of the whole reader.
    while pos < end:
        tag_at = pos
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = varint(buf, pos, end)
            if tag >> 3 > MAX_FIELD_NUMBER:
                raise ValueError(f"malformed: field number {tag >> 3} at byte {tag_at}")
        if tag < 8:
            raise ValueError(f"malformed: field number 0 at byte {tag_at}")
        wire_type = tag & 7
        if wire_type == LEN:
            if pos < end and buf[pos] < 0x80:
                start = pos + 1
                pos = start + buf[pos]
            elif pos + 1 < end and buf[pos + 1] < 0x80:  # 128 to 16383 bytes: most nodes and tensor types
                start = pos + 2
                pos = start + ((buf[pos] & 0x7F) | buf[pos + 1] << 7)
            else:
                length, start = varint(buf, pos, end)
                pos = start + length
            if pos > end:
                raise ValueError(f"truncated: field {tag >> 3} at byte {tag_at} holds {pos - start} bytes but its "
                                 f"message ends at byte {end}")
            if tag in wanted:
                yield tag, start, pos
        elif wire_type == VARINT:
            if pos < end and buf[pos] < 0x80:
                value = buf[pos]
                pos += 1
            else:
                value, pos = varint(buf, pos, end)
            if tag in wanted:
                yield tag, value, pos
        elif wire_type == I64 or wire_type == I32:
            pos += 8 if wire_type == I64 else 4
            if pos > end:
                raise ValueError(f"truncated: fixed-size field {tag >> 3} at byte {tag_at} runs past the end of its "
                                 f"message (byte {end})")
        elif wire_type == SGROUP:
            pos = skip_group(buf, pos, end, tag >> 3, depth + 1)
        elif wire_type == EGROUP:
            raise ValueError(f"malformed: an end-group tag (field {tag >> 3}) at byte {tag_at} without its start")
        else:
            raise ValueError(f"malformed: wire type {wire_type} (field {tag >> 3}) at byte {tag_at}")


def skip_group(buf: memoryview, pos: int, end: int, number: int, depth: int) -> int:
    """The position after the (deprecated) group of field ``number`` whose start tag ends at ``pos``."""
    if depth > MAX_DEPTH:
        raise ValueError(f"malformed: groups nested deeper than {MAX_DEPTH} at byte {pos}")
    while pos < end:
        tag_at = pos
        tag, pos = varint(buf, pos, end)
        inner, wire_type = tag >> 3, tag & 7
        if inner == 0 or inner > MAX_FIELD_NUMBER:
            raise ValueError(f"malformed: field number {inner} at byte {tag_at}")
        if wire_type == EGROUP:
            if inner != number:
                raise ValueError(f"malformed: group {number} ended by the end tag of field {inner} at byte {tag_at}")
            return pos
        if wire_type == VARINT:
            _, pos = varint(buf, pos, end)
        elif wire_type == LEN:
            length, pos = varint(buf, pos, end)
            pos += length
        elif wire_type == I64:
            pos += 8
        elif wire_type == I32:
            pos += 4
        elif wire_type == SGROUP:
            pos = skip_group(buf, pos, end, inner, depth + 1)
        else:
            raise ValueError(f"malformed: wire type {wire_type} (field {inner}) at byte {tag_at}")
        if pos > end:
            raise ValueError(f"truncated: field {inner} at byte {tag_at} runs past the end of its message (byte {end})")
    raise ValueError(f"truncated: group {number} has no end tag before byte {end}")


def text(buf: memoryview, start: int, end: int, what: str) -> str:
    try:
        return str(buf[start:end], "utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"malformed: the {what} at byte {start} is not UTF-8 ({e.reason})") from None
