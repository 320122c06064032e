"""Paths inside a volume, safe against escapes.

A path is resolved in two steps, both required:
1. `locate`: join it to the volume root (an absolute path must already be
   inside the root), resolve every symlink (realpath) and check the result is
   the root or below it. This refuses `../`, absolute paths elsewhere and
   symlinks that point out.
2. `open_at`: open the located path by walking its components from a
   descriptor of the root with O_NOFOLLOW (openat-style), so a component
   swapped for a symlink between step 1 and the open fails (ELOOP/ENOTDIR)
   instead of being followed out of the volume.
Writes go to a temporary file in the same directory (O_EXCL, O_NOFOLLOW),
fsync'd, renamed over the target (rename replaces a symlink, never follows
it), then the directory is fsync'd.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathRefused(Exception):
    """The path is outside the volume, or changed under the call; the text is the is_error."""


@dataclass(frozen=True)
class Located:
    root: Path  # the volume root, symlinks resolved
    parts: tuple[str, ...]  # components below the root ((): the root itself)

    @property
    def rel(self) -> str:
        return "/".join(self.parts) or "."

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.parts)


def locate(root: Path, given: str) -> Located:
    """Resolve `given` inside `root` (step 1 above); the target need not exist."""
    if "\x00" in given:
        raise PathRefused("path contains a NUL byte")
    real_root = Path(os.path.realpath(root))
    candidate = Path(given) if os.path.isabs(given) else real_root / given
    if os.path.isabs(given) and not _inside(Path(os.path.abspath(given)), [Path(os.path.abspath(root)), real_root]):
        raise PathRefused(f"absolute path {given} is outside the volume")
    real = Path(os.path.realpath(candidate))
    if not _inside(real, [real_root]):
        raise PathRefused(f"path {given} resolves outside the volume")
    return Located(root=real_root, parts=real.relative_to(real_root).parts)


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


@contextmanager
def _dir_fd(path: Path) -> Iterator[int]:
    fd = os.open(path, _DIR_FLAGS)
    try:
        yield fd
    finally:
        os.close(fd)


def _walk(root_fd: int, parts: tuple[str, ...], *, create: bool = False) -> int:
    """A new descriptor of the directory `parts` below `root_fd`, no symlink followed;
    `create` makes missing directories."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # a parallel call made it first: open what is there (still O_NOFOLLOW)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as exc:
        os.close(fd)
        raise _refusal(exc, parts) from exc
    return fd


def _refusal(exc: OSError, parts: tuple[str, ...]) -> OSError | PathRefused:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return PathRefused(f"path {'/'.join(parts)} changed under the call or goes through a non-directory")
    return exc


def read_bytes(loc: Located, cap: int) -> tuple[bytes, int]:
    """Up to `cap` bytes of a regular file, and its size."""
    if not loc.parts:
        raise IsADirectoryError(loc.rel)
    with _dir_fd(loc.root) as root_fd:
        dfd = _walk(root_fd, loc.parts[:-1])
        try:
            fd = os.open(loc.parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            raise _refusal(exc, loc.parts) from exc
        finally:
            os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(loc.rel)
        if not stat.S_ISREG(info.st_mode):
            raise PathRefused(f"{loc.rel} is not a regular file")
        return f.read(cap), info.st_size


def write_atomic(loc: Located, data: bytes) -> None:
    """Replace (or create) the file with `data`: temp file, fsync, rename, fsync of the directory."""
    if not loc.parts:
        raise IsADirectoryError(loc.rel)
    name = loc.parts[-1]
    tmp = f".lc-{secrets.token_hex(6)}.tmp"  # short whatever the name: a 255-byte name still fits
    with _dir_fd(loc.root) as root_fd:
        dfd = _walk(root_fd, loc.parts[:-1], create=True)
        try:
            mode = _existing_mode(dfd, name)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
            try:
                os.fchmod(fd, mode)  # exactly the old file's permissions, not reduced by the umask
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                _unlink_quietly(tmp, dfd)
                raise
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _existing_mode(dfd: int, name: str) -> int:
    try:
        info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return 0o644
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(name)
    return stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode) else 0o644


def _unlink_quietly(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:  # never created, or already renamed: nothing to clean
        return


def display(loc: Located) -> str:
    return str(PurePosixPath(loc.rel))
