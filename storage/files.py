"""The store directory and the modes of what partq creates in it."""
from __future__ import annotations

import os
import stat

from partq.storage.errors import InvalidConfig, NotAPartqStore, UnsafeDirectory

# Modes of what partq creates in a store directory, whatever the umask (as PostgreSQL keeps its
# data directory): the directory 0700, data.mdb and lock.mdb 0600. PARTQ_FILE_MODE=0640 (or
# ``Store.open(file_mode=0o640)``) lets the owner's group read them (the directory then 0750).
DEFAULT_FILE_MODE = 0o600
FILE_MODE_ENV = "PARTQ_FILE_MODE"
# what partq itself puts in a store directory
PARTQ_FILES = {"data.mdb", "lock.mdb", "delivery-locks", "standby.lock"}


def file_mode_of(given: int | None) -> int:
    """The mode of a new store's data files: ``given``, else ``$PARTQ_FILE_MODE``, else 0600.
    Owner read and write are required; execute and special bits are refused."""
    if given is None:
        raw = os.environ.get(FILE_MODE_ENV)
        if not raw:
            return DEFAULT_FILE_MODE
        try:
            given = int(raw, 8)
        except ValueError:
            raise InvalidConfig(f"${FILE_MODE_ENV}={raw!r} is not an octal file mode; use e.g. "
                                f"0600 (the default) or 0640") from None
    if type(given) is not int or given & ~0o666 or given & 0o600 != 0o600:
        raise InvalidConfig(f"file_mode {given!r} must give the owner read and write and no execute "
                            f"or special bits: e.g. 0o600 (the default) or 0o640")
    return given


def dir_mode(file_mode: int) -> int:
    """The directory mode that goes with a file mode: search where read is allowed (0640 ->
    0750)."""
    return file_mode | ((file_mode & 0o444) >> 2)


def chmod_own(path: str, mode: int) -> None:
    """Set the mode of a path this process just created (umask ignored)."""
    os.chmod(path, mode)


def prepare_directory(path: str, create: bool, file_mode: int = DEFAULT_FILE_MODE) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotAPartqStore(f"{path} is a file, not a partq directory")
    if not os.path.exists(path):
        if not create:
            raise NotAPartqStore(f"{path} does not exist; create it with `partq --data {path} init`")
        os.makedirs(path, mode=dir_mode(file_mode), exist_ok=True)
        chmod_own(path, dir_mode(file_mode))      # exactly, whatever the umask
        return
    check_ownership(path)
    entries = set(os.listdir(path))
    check_no_links(path, entries)
    check_own_files(path, entries)
    if "data.mdb" not in entries and not create:
        raise NotAPartqStore(f"{path} holds no partq store; create it with `partq --data {path} init`")
    if "data.mdb" not in entries and entries - PARTQ_FILES:
        raise NotAPartqStore(f"{path} holds other files and no partq store; pass a new or empty "
                             f"directory")
    if "data.mdb" not in entries and os.stat(path).st_uid == os.getuid():
        chmod_own(path, dir_mode(file_mode))     # a store is made here: as initdb does

    if "data.mdb" in entries:
        check_not_shared(path)


def _owner(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_ownership(path: str) -> None:
    """Refuse a directory another user owns: whoever owns it could have prepared files in it
    (a ``lock.mdb`` that is a link to a file of ours, say) for partq to write through. As
    PostgreSQL does with its data directory."""
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise UnsafeDirectory(
            f"{path} is owned by {_owner(st.st_uid)}, not by this user ({_owner(os.getuid())}): "
            f"partq writes only a directory its own user owns; run as its owner, give it to "
            f"this user (chown), or open it read-only (--read-only)")


def check_not_shared(path: str) -> None:
    """Refuse a store directory other users may write to (group or world writable): they could
    replace its files between two opens."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o022:
        raise UnsafeDirectory(
            f"{path} may be written by other users (mode {mode:04o}): partq refuses a store "
            f"directory that others can change; run `chmod go-w {path}`")


def check_no_links(path: str, entries: set[str]) -> None:
    """Refuse a store whose own files (``PARTQ_FILES``) are symbolic links or not regular
    files: partq never writes through a link it did not make."""
    for name in sorted(entries & PARTQ_FILES):
        st = os.lstat(os.path.join(path, name))
        kind_ok = stat.S_ISDIR(st.st_mode) if name == "delivery-locks" else stat.S_ISREG(st.st_mode)
        if stat.S_ISLNK(st.st_mode) or not kind_ok:
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise UnsafeDirectory(
                f"{os.path.join(path, name)} is {what}: partq never opens its files through a "
                f"link; remove it if the directory holds no store, or restore the store from a "
                f"backup")


def check_own_files(path: str, entries: set[str]) -> None:
    """Refuse a store whose own files (``PARTQ_FILES``) another user owns, or whose
    ``delivery-locks`` folder others may write to: that user could change the data under
    partq, or put a lock and a socket there that partq's processes would talk to."""
    for name in sorted(entries & PARTQ_FILES):
        full = os.path.join(path, name)
        st = os.lstat(full)
        if st.st_uid != os.getuid():
            raise UnsafeDirectory(
                f"{full} is owned by {_owner(st.st_uid)}, not by this user "
                f"({_owner(os.getuid())}): partq refuses a store whose files another user may "
                f"change; give it back to this user (`chown {os.getuid()} {full}`) "
                f"if it is yours, or restore the store from a backup")
        mode = stat.S_IMODE(st.st_mode)
        if name == "delivery-locks" and mode & 0o022:
            raise UnsafeDirectory(
                f"{full} may be written by other users (mode {mode:04o}): another user could "
                f"put a lock and a socket there that partq would talk to; run `chmod 700 {full}` "
                f"and remove any file in it that this user does not own")
