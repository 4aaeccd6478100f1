"""Publish a folder into the model cache atomically: build it in a temporary folder beside its final
place, then rename it there in one step, so a reader sees the whole folder or none of it.

Several processes may build the same cached model at once (the processes of one launch, two runs
on a shared cache). The first rename wins; a later one fails because the folder is there, and that
is fine when the folder there is complete (``complete(final)``): the loser's copy is dropped. When
it is not complete, the error stands. The temporary folder is removed whatever happens.

Used by every writer of the cache: the shipped BPE models (:func:`mixrl.models.shipped.install`),
the warm-started models (:func:`mixrl.models.supervised.train_and_save`), the tiny reward model
(:mod:`mixrl.models.tiny_rm`), the extended vocabulary (:mod:`mixrl.models.tiny_vocab`) and the
rehearsal's context copies (:func:`mixrl.config.rehearsal.context_copy`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def publishing(final: Path, *, complete: Callable[[Path], bool], replace: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``final`` (mode 0o755, as the shared cache's other
    folders) to build in; when the block ends without an error, rename it to ``final``.

    ``replace``: a folder already at ``final`` (a forced rebuild, or an incomplete leftover) is
    moved aside and deleted first; without it, such a folder makes the rename fail. A failed rename
    is a lost race, and passes, when ``complete(final)``; otherwise its ``OSError`` is raised."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0o700; the cache is meant to be shared like any other
    try:
        yield tmp
        if replace and final.exists():
            old = final.parent / f".{final.name}.old-{os.getpid()}-{time.time_ns()}"
            os.rename(final, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not complete(final):  # lost a race to a concurrent writer that left nothing usable
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
