"""This window's spend by entry and by quota pool, from one `RouterStatus`.

What ``sandbox-router cost`` prints. Every figure is the store's metered
seconds and sessions priced at the entry's rate for its default size
(`policies.pricing.window_spend`), so it is an estimate: the store keeps no
lease's resources nor its rounding to the vendor's billing step. A pool
shared by entries of different prices is priced at the dearest of them (an
upper bound), and says so.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from router.status import RouterStatus

__all__ = ["spend_report"]


def spend_report(status: RouterStatus) -> dict[str, Any]:
    """``{"entries": [...], "pools": [...], "total_usd": ...}``, JSON-ready."""
    entries = [
        {
            "entry": v.name,
            "provider": v.provider,
            "pool": v.pool,
            "spend_usd": v.spend_usd,
            "hourly_usd": v.hourly_usd,
            "sandbox_seconds": v.used["sandbox_seconds"],
            "sessions": v.used["sessions"],
            "price": None
            if v.price is None
            else {**asdict(v.price), "gpu_hour": dict(v.price.gpu_hour)},
            "price_source": v.price_source,
            "reset_at": v.reset_at.isoformat(),
        }
        for v in status.entries
    ]
    pools: dict[str, dict[str, Any]] = {}
    for v in status.entries:
        pool = pools.setdefault(
            v.pool, {"pool": v.pool, "entries": [], "spend_usd": 0.0, "upper_bound": False}
        )
        if pool["entries"] and v.spend_usd != pool["spend_usd"]:
            pool["upper_bound"] = True
        pool["entries"].append(v.name)
        pool["spend_usd"] = max(pool["spend_usd"], v.spend_usd)
    return {
        "state_ok": status.state_ok,
        "entries": entries,
        "pools": list(pools.values()),
        "total_usd": sum(p["spend_usd"] for p in pools.values()),
    }
