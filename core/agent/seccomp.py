"""A seccomp filter for skill scripts, built here and installed by the script's bootstrap.

The filter is inherited by everything the script starts and cannot be lifted, so it holds
where replacing Python's socket functions does not (`import _socket`, a child process, C
code). It refuses, with EPERM:
- `setsid`: a script cannot leave its session, whose processes are all killed when the call
  ends (a double fork with `setsid` outlived it); process groups are free (`timeout` uses one);
- `pidfd_open`, `pidfd_getfd`, `ptrace`, `process_vm_readv` and `process_vm_writev`: another
  process's descriptors and memory, the gateway's own open connections among them;
- without network: `socket` for anything but AF_UNIX, and `io_uring_setup` (io_uring opens
  sockets without the socket call).
Any other architecture than the one the filter was built for kills the process (a 32-bit
system call entry would have other numbers). Built for x86_64 and aarch64; elsewhere there is
no filter and `program` returns None.
"""

from __future__ import annotations

import errno
import platform
import struct
from typing import NamedTuple

__all__ = ["program"]

# classic BPF opcodes (linux/filter.h) and seccomp's return values (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_KILL_PROCESS = 0x80000000
# offsets in struct seccomp_data: nr, arch, then args[0] (its low 32 bits, little-endian)
_NR, _ARCH, _ARG0 = 0, 4, 16
_AF_UNIX = 1
_X32_BIT = 0x40000000  # x86_64's x32 entry points: the same calls under other numbers


class _Arch(NamedTuple):
    audit: int  # AUDIT_ARCH_*, as seccomp_data.arch holds it
    socket: int
    setsid: int
    ptrace: int
    process_vm: tuple[int, int]  # process_vm_readv, process_vm_writev
    x32: bool


_ARCHES = {
    "x86_64": _Arch(0xC000003E, socket=41, setsid=112, ptrace=101, process_vm=(310, 311), x32=True),
    "aarch64": _Arch(
        0xC00000B7, socket=198, setsid=157, ptrace=117, process_vm=(270, 271), x32=False
    ),
}
# the same on both: io_uring_setup, pidfd_open, pidfd_getfd
_IO_URING_SETUP, _PIDFD_OPEN, _PIDFD_GETFD = 425, 434, 438


def program(*, network: bool, machine: str | None = None) -> bytes | None:
    """The filter as `struct sock_filter[]` bytes for this machine, or None where there is none."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    refused = [arch.setsid, arch.ptrace, *arch.process_vm, _PIDFD_OPEN, _PIDFD_GETFD]
    refused += [] if network else [_IO_URING_SETUP]
    # each entry: (opcode, k, jump-if-true label, jump-if-false label); labels are the
    # three returns at the end, None is the next instruction
    code: list[tuple[int, int, str | None, str | None]] = [
        (_LD_W_ABS, _ARCH, None, None),
        (_JEQ_K, arch.audit, None, "kill"),
        (_LD_W_ABS, _NR, None, None),
    ]
    if arch.x32:
        code.append((_JGE_K, _X32_BIT, "refuse", None))
    code += [(_JEQ_K, nr, "refuse", None) for nr in refused]
    if not network:
        code += [
            (_JEQ_K, arch.socket, None, "allow"),
            (_LD_W_ABS, _ARG0, None, None),
            (_JEQ_K, _AF_UNIX, "allow", "refuse"),
        ]
    ends = {"allow": len(code), "refuse": len(code) + 1, "kill": len(code) + 2}
    out = bytearray()
    for at, (op, k, true, false) in enumerate(code):
        jt = 0 if true is None else ends[true] - at - 1
        jf = 0 if false is None else ends[false] - at - 1
        out += struct.pack("<HBBI", op, jt, jf, k)
    for value in (_ALLOW, _ERRNO | errno.EPERM, _KILL_PROCESS):
        out += struct.pack("<HBBI", _RET_K, 0, 0, value)
    return bytes(out)
