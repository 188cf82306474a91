"""This window's spend by entry and by quota pool, from one `RouterStatus`.

What ``sandbox-router cost`` prints (`spend_report`), and ``cost --month``
(`month_report`): each pool's month as its ledger settled it (every lease's
own cost, exact), what live leases hold, its ``usd`` budget and what is left
of it, and the month-end it heads for (`policies.quota.projected_spend`).

Per entry, every figure is the store's metered seconds and sessions priced
at the entry's rate for its default size (`policies.pricing.window_spend`),
so it is an estimate: the store keeps no lease's resources nor its rounding
to the vendor's billing step. A pool shared by entries of different prices
is priced at the dearest of them (an upper bound), and says so.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from router.status import RouterStatus

__all__ = ["month_report", "spend_report"]


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


def month_report(status: RouterStatus) -> dict[str, Any]:
    """``spend_report`` plus each pool's month from its ledger: ``{"entries": [...],
    "pools": [...], "total_usd", "projected_usd"}``, JSON-ready.

    A pool's ``spent_usd`` is the ledger's settled ``usd`` (the leases' own costs
    and the spend around them), ``estimate_usd`` the seconds-and-sessions estimate
    `spend_report` shows; ``left_usd`` is the budget minus what is spent and held
    (None without a budget); ``projected_usd`` where the spend ends at the reset.
    """
    report = spend_report(status)
    estimates = {p["pool"]: p for p in report["pools"]}
    pools: dict[str, dict[str, Any]] = {}
    for v in status.entries:
        if v.pool in pools:
            continue
        budget = v.limits["usd"]
        spent, held = v.used["usd"], v.usd_held
        pools[v.pool] = {
            "pool": v.pool,
            "entries": estimates[v.pool]["entries"],
            "window_start": v.window_start.isoformat(),
            "reset_at": v.reset_at.isoformat(),
            "spent_usd": spent,
            "held_usd": held,
            "estimate_usd": estimates[v.pool]["spend_usd"],
            "budget_usd": budget,
            "left_usd": None if budget is None else max(0.0, budget - spent - held),
            "projected_usd": v.usd_projected,
            "over_budget": budget is not None and v.usd_projected > budget,
        }
    return {
        "state_ok": status.state_ok,
        "entries": report["entries"],
        "pools": list(pools.values()),
        "total_usd": sum(p["spent_usd"] for p in pools.values()),
        "projected_usd": sum(p["projected_usd"] for p in pools.values()),
    }
