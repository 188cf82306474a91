"""Rich results from Daytona's own interpreter, which gives only stdout, stderr and the error.

Each cell is sent wrapped: the first cell of a context here (and the first
after its worker restarted, found ``missing``) defines the router's
`providers.kernel.program` as a module in the context's namespace
(``__sandbox_router__``), and every cell runs through its
``daytona_cell``. That puts the results (the last expression's value, what
was displayed, figures) and the error, as the router's kernel reports them,
in one line of stdout marked with a nonce made for the call, which
`results_of` takes out again. Whether the module had to be defined says
whether the context's state was lost (``fresh``).
"""

from __future__ import annotations

import json
from typing import Any

from providers.kernel.host import source

__all__ = ["daytona_results", "results_of"]

_INSTALL = """try:
    __sandbox_router__.fresh = False
except NameError:
    __sandbox_router__ = __import__("types").ModuleType("sandbox_router_kernel")
    exec(compile({source}, "<sandbox-router>", "exec"), __sandbox_router__.__dict__)
    __sandbox_router__.fresh = True
__sandbox_router__.daytona_cell({code}, globals(), {nonce}, __sandbox_router__.fresh)
"""

_RUN = """try:
    __sandbox_router__
except NameError:
    print({missing})
else:
    __sandbox_router__.daytona_cell({code}, globals(), {nonce}, False)
"""


def daytona_results(code: str, nonce: str, *, installed: bool) -> str:
    """``code`` as a cell for Daytona's interpreter that reports its results under ``nonce``.

    Where the module is believed ``installed`` (an earlier cell here defined
    it) the cell leaves its source out, and says ``missing`` (running
    nothing) if the context lost it: then it is sent again with the source.
    """
    if not installed:
        return _INSTALL.format(source=repr(source()), code=repr(code), nonce=repr(nonce))
    missing = repr("\x00" + nonce + json.dumps({"missing": True, "fresh": True}))
    return _RUN.format(code=repr(code), nonce=repr(nonce), missing=missing)


def results_of(stdout: str, nonce: str) -> tuple[str, dict[str, Any]]:
    """The cell's own stdout, and what its marked line held (nothing when it has none:
    the cell did not get that far)."""
    mark = "\x00" + nonce
    at = stdout.rfind(mark)
    if at < 0:
        return stdout, {}
    line, _, rest = stdout[at + len(mark) :].partition("\n")
    try:
        marked = json.loads(line)
    except ValueError:
        return stdout, {}
    return stdout[:at] + rest, marked if isinstance(marked, dict) else {}
