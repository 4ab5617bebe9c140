"""Write a wheel that reuses the compressed bytes of an existing one.

Why not ``wheel.wheelfile.WheelFile`` (or ``zipfile``) for writing: both can only add a member by
compressing it, so rebuilding the 192 MB torch wheel means inflating and deflating all of its
12,000 members (about 22 s here). The series changes a handful of files; every other member is
copied as its stored deflate stream, with its CRC and sizes, and its hash comes from the base
RECORD (which basewheel.verify trusts only for a known or fully checked wheel). The result is a
plain zip: local headers without data descriptors or extra fields, then the central directory.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import struct
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_UTF8 = 0x800
_LIMIT = 0xFFFFFFFF


@dataclass
class Member:
    name: str
    date_time: tuple[int, ...]
    external_attr: int
    crc: int
    size: int
    compressed: bytes | memoryview
    method: int = zipfile.ZIP_DEFLATED


def raw_member(archive: memoryview, info: zipfile.ZipInfo, name: str | None = None) -> Member:
    """``info``'s compressed bytes as they are stored in ``archive`` (the whole zip file, a view
    of it: not copied), under ``name`` if given."""
    start = info.header_offset + _LOCAL.size
    fields = _LOCAL.unpack(archive[info.header_offset:start])
    if fields[0] != 0x04034B50:
        raise zipfile.BadZipFile(f"bad local header for {info.filename}")
    start += fields[9] + fields[10]  # name and extra field
    data = archive[start:start + info.compress_size]
    if len(data) != info.compress_size:
        raise zipfile.BadZipFile(f"{info.filename} is truncated")
    return Member(name or info.filename, info.date_time, info.external_attr, info.CRC,
                  info.file_size, data, info.compress_type)


def new_member(name: str, data: bytes, like: zipfile.ZipInfo) -> Member:
    """``data`` deflated at a fixed level, with ``like``'s time stamp and mode (reproducible)."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return Member(name, like.date_time, like.external_attr, zlib.crc32(data), len(data),
                  c.compress(data) + c.flush())


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def read_record(text: str) -> dict[str, list[str]]:
    """A RECORD's rows by path: [path, hash, size]."""
    return {row[0]: row for row in csv.reader(io.StringIO(text)) if row}


def record_text(rows: list[tuple[str, str, str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def _dos(date_time: tuple[int, ...]) -> tuple[int, int]:
    y, mo, d, h, mi, s = date_time
    return (h << 11) | (mi << 5) | (s // 2), ((y - 1980) << 9) | (mo << 5) | d


def write(out, members: Iterable[Member]) -> None:
    """Write ``members`` in order to the binary file ``out`` as a zip archive."""
    central = []
    offset = 0
    for m in members:
        name = m.name.encode()
        flags = 0 if name.isascii() else _UTF8
        dtime, ddate = _dos(m.date_time)
        if max(offset, m.size, len(m.compressed)) > _LIMIT:
            raise ValueError("archive needs zip64, which this writer does not produce")
        head = _LOCAL.pack(0x04034B50, 20, flags, m.method, dtime, ddate, m.crc,
                           len(m.compressed), m.size, len(name), 0)
        out.write(head + name)
        out.write(m.compressed)
        central.append(_CENTRAL.pack(0x02014B50, (3 << 8) | 20, 20, flags, m.method, dtime,
                                     ddate, m.crc, len(m.compressed), m.size, len(name), 0, 0,
                                     0, 0, m.external_attr, offset) + name)
        offset += len(head) + len(name) + len(m.compressed)
    cd = b"".join(central)
    if offset + len(cd) > _LIMIT or len(central) > 0xFFFF:
        raise ValueError("archive needs zip64, which this writer does not produce")
    out.write(cd)
    out.write(_END.pack(0x06054B50, 0, 0, len(central), len(central), len(cd), offset, 0))
