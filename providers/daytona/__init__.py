"""The ``daytona`` provider: sandboxes on Daytona through its generated API clients.

Each chain entry is one Daytona organization (one API key: ``api_key``,
else ``DAYTONA_API_KEY``; the API URL from ``api_url``, else
``DAYTONA_API_URL``, else Daytona's cloud). The adapter speaks to Daytona
through ``daytona_api_client_async`` (the control plane) and
``daytona_toolbox_api_client_async`` (the toolbox in each sandbox), the
generated clients the ``daytona`` SDK is built on, without the SDK: its
import alone takes a fresh interpreter to ~100 MB (OpenTelemetry, Socket.IO,
the sync clients). The clients are imported and opened on first use, one
`providers.daytona.client.DaytonaClient` per event loop (their connection
pool belongs to it); a sandbox's ``native``, the SDK's ``AsyncSandbox``,
imports the SDK for its callers only. Requests are retried only when a
connection was refused or (for an idempotent one) dropped, as the SDK
retries them, so the router's retry policy is the one.

Modules: ``options`` (the entry's options), ``client`` (the generated
clients, their shared pool and headers), ``provider`` (create, connect, list,
kill, the clean-up of failed creates and Daytona's server-side warm pools,
``keep_warm``), ``sandbox`` (a sandbox's stop, snapshot and delete, over
its ``commands``, ``files`` and code, ``interpreter``, which all go through
``handle``: the toolbox client and its errors), ``processes`` (background
processes and terminals), ``states`` (what Daytona's sandbox states mean
here) and ``errors`` (the one mapping of Daytona's errors).
"""

from providers.daytona.options import API_KEY_ENV, API_URL_ENV, DaytonaOptions
from providers.daytona.provider import DaytonaProvider
from providers.daytona.sandbox import DaytonaSandbox

__all__ = ["API_KEY_ENV", "API_URL_ENV", "DaytonaOptions", "DaytonaProvider", "DaytonaSandbox"]
