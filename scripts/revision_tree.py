"""Another git revision's files, for the scripts that build or time this checkout against it
(compare_cubins.py, time_against_revision.py): `git archive` unpacked into a folder, so the
repository's own state (worktrees, index) is left alone and a copy without write access to
.git works too."""

import subprocess
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


class NoSuchRevision(Exception):
    """git could not give the revision's files; the message says why."""


def unpack(rev: str, into: Path) -> Path:
    """The files of `rev` under `into` (created), which is returned."""
    archive = subprocess.run(["git", "archive", rev], cwd=CHECKOUT, capture_output=True,
                             check=False)
    if archive.returncode:
        raise NoSuchRevision(f"git archive {rev}: {archive.stderr.decode().strip()}")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into
