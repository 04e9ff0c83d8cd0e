"""Reading a model file: regular files only, and never more than the size limit."""

import os
import stat
from os import PathLike
from pathlib import Path

from embed.errors import ModelImportError


def read_limited(path: str | PathLike[str], max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``; a FIFO, device or folder is refused before it is opened (and again
    after, opened without blocking, should it have been swapped in between), as is a file over ``max_bytes``."""
    file = Path(path)
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):
            raise ModelImportError(f"{file.name} is not a regular file; give the path of a model file")
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ModelImportError(f"{file.name} is not a regular file; give the path of a model file")
            if info.st_size > max_bytes:
                raise ModelImportError(f"{file.name} is {info.st_size} bytes, over the limit of {max_bytes} bytes "
                                       "(TUNEBANK_MAX_MODEL_BYTES)")
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ModelImportError(f"cannot read {file.name}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ModelImportError(f"{file.name} is over the limit of {max_bytes} bytes (TUNEBANK_MAX_MODEL_BYTES)")
    return data
