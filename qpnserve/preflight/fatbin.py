"""The GPU architectures compiled into a shared library, read from its CUDA fatbin headers.

Why: ``torch.cuda.get_arch_list()`` needs ``import torch`` (~2.5 s here) and returns [] when
no GPU is visible; the same list is recorded in the ``.nv_fatbin`` ELF section of
libtorch_cuda.so, which can be walked by its small headers without reading the kernels.

Layout (little-endian), as written by nvcc's fatbinary:
- container header, 16 bytes: magic u32 0xBA55ED50, version u16, header_size u16,
  payload_size u64; the entries follow the header and fill payload_size bytes;
- entry header: kind u16 (1 = PTX, 2 = ELF cubin), u16, header_size u32, payload_size u64,
  ..., arch u32 at byte 28 (70 = sm_70); the next entry starts header_size + payload_size on.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
_KIND_PTX = 1
_KIND_CUBIN = 2


def _section(mapped: mmap.mmap, name: bytes) -> tuple[int, int] | None:
    """(offset, size) of an ELF64 little-endian section, or None."""
    if mapped[:4] != b"\x7fELF" or mapped[4] != 2 or mapped[5] != 1:
        return None
    shoff = struct.unpack_from("<Q", mapped, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", mapped, 0x3A)
    if shoff == 0 or shnum == 0 or shstrndx >= shnum:
        return None
    str_hdr = shoff + shstrndx * shentsize
    str_off = struct.unpack_from("<Q", mapped, str_hdr + 0x18)[0]
    for i in range(shnum):
        hdr = shoff + i * shentsize
        name_off = struct.unpack_from("<I", mapped, hdr)[0]
        start = str_off + name_off
        end = mapped.find(b"\x00", start)
        if mapped[start:end] == name:
            offset, size = struct.unpack_from("<QQ", mapped, hdr + 0x18)
            return offset, size
    return None


def archs_in_fatbin(data: mmap.mmap | bytes, offset: int, size: int) -> list[str]:
    """Sorted architecture names ("sm_70" for a cubin, "compute_90" for PTX) in a fatbin
    region."""
    found: set[str] = set()
    pos, end = offset, offset + size
    while pos + 16 <= end:
        magic, _version, header_size, payload = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            # Padding between containers: resync on the next container header. Searching from
            # the end of the previous container, the first magic found is that header.
            nxt = data.find(struct.pack("<I", FATBIN_MAGIC), pos + 1, end)
            if nxt < 0:
                break
            pos = nxt
            continue
        entry, entries_end = pos + header_size, min(end, pos + header_size + payload)
        while entry + 32 <= entries_end:
            kind, _, entry_header, entry_payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            if kind == _KIND_CUBIN:
                found.add(f"sm_{arch}")
            elif kind == _KIND_PTX:
                found.add(f"compute_{arch}")
            if entry_header == 0:
                break
            entry += entry_header + entry_payload
        pos = pos + header_size + payload
    return sorted(found, key=lambda a: (a.startswith("compute"), int(a.split("_")[1])))


def fatbin_archs(library: Path) -> list[str] | None:
    """Architectures compiled into ``library``; None when it has no fatbin section.
    Raises OSError when the file cannot be read."""
    with library.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        section = _section(mapped, b".nv_fatbin")
        if section is None:
            return None
        return archs_in_fatbin(mapped, *section)
