"""The ``daytona`` provider: sandboxes on Daytona through the ``daytona`` SDK's AsyncDaytona.

Each chain entry is one Daytona organization (one API key: ``api_key``,
else ``DAYTONA_API_KEY``; the API URL from ``api_url``, else
``DAYTONA_API_URL``). Its ``AsyncDaytona`` client is created on first use
and reused; ``daytona`` itself is imported only then (it is slow to import).
The client keeps a Socket.IO connection on its event loop (how it learns that
a sandbox started), so `DaytonaProvider.aclose` must run on that loop: a loop
closed under a live client waits for the socket's tasks (~25 s). The SDK has
no retry switch (it retries nothing but a refused or dropped connection,
twice, and GETs dropped mid-way), so the router's retry policy is the one.

Modules: ``options`` (the entry's options), ``provider`` (create, connect,
list, kill, the clean-up of failed creates and Daytona's server-side warm
pools, ``keep_warm``), ``sandbox`` (commands, files,
code), ``states`` (what Daytona's sandbox states mean here) and ``errors``
(the one mapping of SDK exceptions).
"""

from providers.daytona.options import API_KEY_ENV, API_URL_ENV, DaytonaOptions
from providers.daytona.provider import DaytonaProvider
from providers.daytona.sandbox import DaytonaSandbox

__all__ = ["API_KEY_ENV", "API_URL_ENV", "DaytonaOptions", "DaytonaProvider", "DaytonaSandbox"]
