"""Directories that only this process's user can write: the checks made before trusting what is
found in one (the Iceberg jobs' scratch directories, ``iceberg/session/scratch.py``). Someone
who could write there could swap a file between its writing and its reading, or plant a symbolic link.

Standard library only, below every other layer.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def private_dir_problem(path: Path) -> str | None:
    """Creates ``path`` with mode 0700 when missing (not its parents), then checks it: what is
    wrong with it (a symbolic link, not a directory, another user's, writable by group or
    others), or None."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this process's uid {os.geteuid()}"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); make it 0700"
    return None
