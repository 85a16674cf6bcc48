"""The library's device code a kernel file may include: `#include <convlab/wgmma>` stands for
the wgmma family's kernels (gathers, the grid, persistent and halo schedules, epilogues) without
their mainloop step, `mainloop_step`, which the file then defines. `convlab new NAME --from
wgmma-fp16` (or any wgmma rung) writes such a file, holding the library's own step to start from,
and a NAME.py that launches it as the rung launches its source (`source_of`)."""

from __future__ import annotations

import re
from pathlib import Path

from ..kernels import wgmma
from .kernelfile import KernelFileError

HEADERS = {"convlab/wgmma": wgmma.KERNELS}
INCLUDE = re.compile(r"(?m)^[ \t]*#[ \t]*include[ \t]*<(convlab/[^>\n]*)>[^\n]*$")


def expand(text: str, path: Path) -> str:
    """`text` with every `#include <convlab/NAME>` line replaced by that header's code. #line
    directives around it keep NVRTC's line numbers the file's own, so its messages name the
    user's lines (and a header's lines, should one fail to compile, as <convlab/NAME>'s)."""
    def header(match: re.Match) -> str:
        name = match.group(1)
        line = text.count("\n", 0, match.start()) + 1
        if name not in HEADERS:
            raise KernelFileError(f"{path}:{line}: no library header <{name}>; there is "
                                  f"{', '.join(f'<{h}>' for h in HEADERS)}")
        return f'#line 1 "{name}"\n{HEADERS[name]}\n#line {line + 1} "{path.name}"'

    return INCLUDE.sub(header, text)


def source_of(path: str | Path) -> str:
    """The source a kernel file compiles to: its text, library headers expanded."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise KernelFileError(f"{path}: cannot read it ({exc})") from None
    return expand(text, path)
