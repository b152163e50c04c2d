"""PTX -> cubin with nvJitLink (no GPU needed), cached in memory and on disk.

nvJitLink runs ptxas in-process and returns its full error log, which the driver JIT does
not; the cubin it produces is what `cuModuleLoadData` loads. The disk cache lives in
`$PTXDSL_CACHE_DIR` (default `~/.cache/ptxdsl`); `PTXDSL_CACHE=0` turns it off.

nvJitLink compiles PTX as relocatable code, and there ptxas ignores `setmaxnreg` ("to maintain
compatibility across compilation units", C7504): warp-specialized kernels then run every role
on the entry's register count, and one that needs more (attention's consumers) spills and has
its wgmmas serialized (C7512). Such modules (`whole_program`) are still assembled here, for the
errors and the check, but are loaded as PTX: the driver JIT compiles whole programs.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import CompileError, DeviceError

_MAGIC = b"PTXDSL-CUBIN-1\n"
_ARCH = re.compile(r"sm_\d+[af]?")
_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$%][\w$]*)")


@dataclass
class CacheStats:
    """How `ptx_to_cubin` answered so far: from memory, from disk, or by compiling."""

    memory_hits: int = 0
    disk_hits: int = 0
    compiles: int = 0


stats = CacheStats()
_memory: dict[str, tuple[bytes, str]] = {}
_lock = threading.Lock()


@functools.cache
def nvjitlink_version() -> tuple[int, int]:
    """(major, minor) of the nvJitLink library that compiles PTX."""
    major, minor = _nvjitlink().version()
    return int(major), int(minor)


def cache_key(ptx: str, arch: str) -> str:
    """sha256 over the PTX text, the target and the nvJitLink version."""
    h = hashlib.sha256()
    for part in (ptx, arch, repr(nvjitlink_version()), repr(_options(arch))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def cache_dir() -> Path:
    """The directory of the disk cache (it may not exist yet)."""
    env = os.environ.get("PTXDSL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ptxdsl"


def clear_memory_cache() -> None:
    """Forget the in-process cubins (the disk cache is kept)."""
    with _lock:
        _memory.clear()


def whole_program(ptx: str) -> bool:
    """Whether `ptx` must be compiled as a whole program to run as written: it resizes the
    register file per warp (`setmaxnreg`), which relocatable compilation ignores."""
    return "setmaxnreg." in ptx


def remember(ptx: str, arch: str, entry: tuple[bytes, str]) -> None:
    """Put a cubin assembled elsewhere (a worker process) in the memory cache."""
    with _lock:
        _memory.setdefault(cache_key(ptx, arch), entry)


def ptx_to_cubin(ptx: str, arch: str, kernel_names: Iterable[str] = ()) -> tuple[bytes, str]:
    """Assemble `ptx` for `arch` (e.g. "sm_90a"); returns the cubin and ptxas's info log.

    Raises CompileError naming the kernels (`kernel_names`, or the `.entry` names found in
    the PTX) with ptxas's error lines when the PTX is rejected."""
    if not _ARCH.fullmatch(arch):
        raise CompileError(f"arch must look like 'sm_90a', got {arch!r}")
    key = cache_key(ptx, arch)
    with _lock:
        hit = _memory.get(key)
        if hit is not None:
            stats.memory_hits += 1
            return hit
    entry = _read_disk(key)
    if entry is not None:
        with _lock:
            stats.disk_hits += 1
    else:
        names = list(kernel_names) or _ENTRY.findall(ptx)
        entry = _compile(ptx, arch, names)
        with _lock:
            stats.compiles += 1
        _write_disk(key, *entry)
    with _lock:
        _memory[key] = entry
    return entry


def _options(arch: str) -> list[str]:
    return [f"-arch={arch}", "-verbose"]


def _nvjitlink():
    try:
        from cuda.bindings import nvjitlink
    except ImportError as e:
        raise DeviceError(f"nvJitLink is not available: {e}") from None
    return nvjitlink


def _log(nj, handle: int, error: bool) -> str:
    size = (nj.get_error_log_size if error else nj.get_info_log_size)(handle)
    if not size:
        return ""
    buf = bytearray(size)
    (nj.get_error_log if error else nj.get_info_log)(handle, buf)
    return c_string(buf)


def c_string(buf: bytearray) -> str:
    """A NUL-terminated log buffer (nvJitLink's, the driver JIT's) as text."""
    return bytes(buf).split(b"\0", 1)[0].decode(errors="replace").rstrip()


def _compile(ptx: str, arch: str, names: list[str]) -> tuple[bytes, str]:
    nj = _nvjitlink()
    data = ptx.encode()
    opts = _options(arch)
    try:
        handle = nj.create(len(opts), opts)
    except Exception as e:
        raise DeviceError(f"nvJitLink could not start: {e}") from None
    try:
        try:
            nj.add_data(handle, nj.InputType.PTX, data, len(data), "ptxdsl.ptx")
            nj.complete(handle)
        except nj.nvJitLinkError as e:
            raise CompileError(_rejection(names, arch, str(e), _log(nj, handle, True))) from None
        info = _log(nj, handle, False)
        cubin = bytearray(nj.get_linked_cubin_size(handle))
        nj.get_linked_cubin(handle, cubin)
        return bytes(cubin), info
    finally:
        nj.destroy(handle)


def _rejection(names: list[str], arch: str, status: str, log: str) -> str:
    which = ", ".join(f"'{n}'" for n in names) or "(no .entry found)"
    noun = "kernel" if len(names) == 1 else "kernels"
    lines = [ln for ln in log.splitlines() if ln.strip()] or [f"nvJitLink: {status}"]
    return f"ptxas rejected the PTX of {noun} {which} for {arch}:\n" + "\n".join(
        f"  {ln}" for ln in lines
    )


def _disk_enabled() -> bool:
    return os.environ.get("PTXDSL_CACHE", "1") != "0"


def _read_disk(key: str) -> tuple[bytes, str] | None:
    """A cached entry, or None when missing, unreadable or corrupt (it is then rebuilt)."""
    if not _disk_enabled():
        return None
    try:
        raw = (cache_dir() / f"{key}.cubin").read_bytes()
    except OSError:
        return None
    head = len(_MAGIC)
    if not raw.startswith(_MAGIC) or len(raw) < head + 36:
        return None
    digest, payload = raw[head : head + 32], raw[head + 32 :]
    if hashlib.sha256(payload).digest() != digest:
        return None
    info_len = int.from_bytes(payload[:4], "little")
    info, cubin = payload[4 : 4 + info_len], payload[4 + info_len :]
    if not cubin.startswith(b"\x7fELF"):
        return None
    return cubin, info.decode(errors="replace")


def _write_disk(key: str, cubin: bytes, info: str) -> None:
    """Best effort: a cache that cannot be written only costs a recompile next time."""
    if not _disk_enabled():
        return
    info_b = info.encode()
    payload = len(info_b).to_bytes(4, "little") + info_b + cubin
    blob = _MAGIC + hashlib.sha256(payload).digest() + payload
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{key[:16]}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            # Rename is atomic, so a concurrent reader sees the old file or the whole new one.
            os.replace(tmp, directory / f"{key}.cubin")
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
