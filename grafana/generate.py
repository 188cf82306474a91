"""Build sandbox-router's Grafana dashboards with grafana-foundation-sdk.

    python grafana/generate.py          # (re)write grafana/dashboards/*.json
    python grafana/generate.py --check  # exit 1 when a committed file is stale

The JSON files are committed so ``grafana/`` can be mounted into a stock
Grafana as its provisioning directory; ``tests/metrics`` fails when they
differ from what this script builds, and runs every panel query against a
real Prometheus scraping a router.

Queries take ``max`` over replicas for the state gauges (every replica
reports the same shared state) and ``sum`` for the counters (each replica
counts its own traffic).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMapping,
    ValueMappingResult,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
ENTRY = 'entry=~"$entry"'
POOL = 'pool=~"$pool"'
RATE = "$__rate_interval"


def query(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> prom.Dataquery:
    q = prom.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    q = q.legend_format(legend or "__auto")
    return q.instant() if instant else q.range()


def thresholds(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    return (
        dash.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=v, color=c) for v, c in steps])
    )


def legend_table() -> common_b.VizLegendOptions:
    return (
        common_b.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["lastNotNull", "max"])
    )


def last_value() -> common_b.ReduceDataOptions:
    return common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False)


def series(title: str, description: str, *targets: prom.Dataquery) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .height(8)
        .span(12)
        .legend(legend_table())
        .fill_opacity(10)
    )
    return panel.targets(list(targets))


def datasource_variable() -> dash.DatasourceVariable:
    return dash.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(name: str, label: str, expr: str) -> dash.QueryVariable:
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query(expr)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(VariableOption(selected=True, text="All", value="$__all"))
    )


def base(title: str, uid: str, description: str) -> dash.Dashboard:
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["sandbox-router"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .refresh("1m")
        .time("now-24h", "now")
        .timezone("browser")
        .with_variable(datasource_variable())
        .with_variable(
            query_variable("entry", "Entry", "label_values(sandbox_router_entry_info, entry)")
        )
    )


def quota_dashboard() -> dash.Dashboard:
    used = f'sandbox_router_quota_used{{{POOL}, unit!="concurrent"}}'
    board = base(
        "sandbox-router: Quota",
        "sandbox-router-quota",
        "Quota used against each pool's limit, how fast it burns, when it runs out at the "
        "current rate and when the window resets. Gauges read from the shared state store: "
        "every replica reports the fleet's numbers.",
    ).with_variable(
        query_variable(
            "pool", "Pool", 'label_values(sandbox_router_entry_info{entry=~"$entry"}, pool)'
        )
    )
    board = board.with_row(dash.Row("Now"))
    board = board.with_panel(
        bargauge.Panel()
        .reduce_options(last_value())
        .title("Used / limit")
        .description("Share of each limited unit used this window (amber 80 %, red 95 %).")
        .datasource(DS)
        .height(8)
        .span(12)
        .unit("percentunit")
        .min(0)
        .max(1)
        .thresholds(thresholds((None, "green"), (0.8, "orange"), (0.95, "red")))
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .orientation(common.VizOrientation.HORIZONTAL)
        .targets(
            [
                query(
                    f"max by (pool, unit) (sandbox_router_quota_used{{{POOL}}}"
                    f" / (sandbox_router_quota_limit{{{POOL}}} > 0))",
                    "{{pool}} {{unit}}",
                    instant=True,
                )
            ]
        )
    )
    board = board.with_panel(
        stat.Panel()
        .reduce_options(last_value())
        .title("Days to reset")
        .description("Days until each pool's quota window resets.")
        .datasource(DS)
        .height(8)
        .span(4)
        .unit("none")
        .decimals(1)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .thresholds(thresholds((None, "blue")))
        .targets(
            [
                query(
                    f"min by (pool) ((sandbox_router_quota_window_reset_timestamp_seconds"
                    f"{{{POOL}}} - time()) / 86400)",
                    "{{pool}}",
                    instant=True,
                )
            ]
        )
    )
    board = board.with_panel(
        stat.Panel()
        .reduce_options(last_value())
        .title("Projected exhaustion")
        .description(
            "When each unit runs out: at the last 6 hours' rate, and at this window's average "
            "rate (what `sandbox-router status` shows). Red when before the window's reset."
        )
        .datasource(DS)
        .height(8)
        .span(8)
        .unit("dateTimeAsIso")
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .color_mode(common.BigValueColorMode.VALUE)
        .thresholds(thresholds((None, "text")))
        .targets(
            [
                query(
                    f"1000 * (time() + max by (pool, unit) "
                    f'(sandbox_router_quota_remaining{{{POOL}, unit!="concurrent"}})'
                    f" / (max by (pool, unit) (deriv({used}[6h])) > 0))",
                    "{{pool}} {{unit}} (last 6h rate)",
                    instant=True,
                ),
                query(
                    "1000 * max by (pool, unit) "
                    f"(sandbox_router_quota_projected_exhaustion_timestamp_seconds{{{POOL}}})",
                    "{{pool}} {{unit}} (window average)",
                    "B",
                    instant=True,
                ),
            ]
        )
    )
    board = board.with_row(dash.Row("Usage over time"))
    for unit, title, grafana_unit in (
        ("sessions", "Sessions (sandboxes created)", "short"),
        ("sandbox_seconds", "Sandbox time", "s"),
        ("concurrent", "Concurrent leases", "short"),
    ):
        selector = f'{{{POOL}, unit="{unit}"}}'
        board = board.with_panel(
            series(
                f"{title}: used vs limit",
                f"Used this window against the pool's limit ({unit}).",
                query(f"max by (pool) (sandbox_router_quota_used{selector})", "{{pool}} used"),
                query(
                    f"max by (pool) (sandbox_router_quota_limit{selector})", "{{pool}} limit", "B"
                ),
            )
            .unit(grafana_unit)
            .span(8)
        )
    board = board.with_panel(
        series(
            "Burn rate per day",
            "How much of each unit is used per day: over the last hour, and on average since "
            "the window started.",
            query(
                f"86400 * max by (pool, unit) (clamp_min(deriv({used}[1h]), 0))",
                "{{pool}} {{unit}} (last hour)",
            ),
            query(
                f"86400 * max by (pool, unit) ({used} / ignoring (unit) group_left () "
                f"(time() - sandbox_router_quota_window_start_timestamp_seconds{{{POOL}}}))",
                "{{pool}} {{unit}} (window average)",
                "B",
            ),
        ).unit("short")
    )
    board = board.with_panel(
        series(
            "Remaining",
            "Limit minus used, per pool and limited unit.",
            query(
                f"max by (pool, unit) (sandbox_router_quota_remaining{{{POOL}}})",
                "{{pool}} {{unit}}",
            ),
        ).unit("short")
    )
    return cost_row(board)


def cost_row(board: dash.Dashboard) -> dash.Dashboard:
    """What the pools cost: spend by entry, how fast it burns, the projected month-end."""
    spent = f'sandbox_router_quota_used{{{POOL}, unit="usd"}}'
    board = board.with_row(dash.Row("Cost"))
    board = board.with_panel(
        series(
            "Spend by entry",
            "USD per hour the released leases cost at each entry's price (the "
            "sandbox_router_cost_usd_total counters, every replica summed), with the late "
            "creates, hedge losers, warm idle time and paused storage charged around them.",
            query(
                f"3600 * sum by (entry, pool) (rate(sandbox_router_cost_usd_total{{{ENTRY}}}"
                f"[{RATE}]))",
                "{{entry}} ({{pool}})",
            ),
        )
        .unit("currencyUSD")
        .span(8)
    )
    board = board.with_panel(
        series(
            "Burn rate (USD per day)",
            "Each pool's settled spend per day: over the last hour, and on average since the "
            "window started (the rate the projection goes on at).",
            query(
                f"86400 * max by (pool) (clamp_min(deriv({spent}[1h]), 0))",
                "{{pool}} (last hour)",
            ),
            query(
                f"86400 * max by (pool) ({spent} / ignoring (unit) "
                f"(time() - sandbox_router_quota_window_start_timestamp_seconds{{{POOL}}}))",
                "{{pool}} (window average)",
                "B",
            ),
        )
        .unit("currencyUSD")
        .span(8)
    )
    return board.with_panel(
        series(
            "Projected month-end against budget",
            "Each pool's settled spend this window, where it ends at the window's reset at "
            "the window's average rate, and its usd budget (pools with one): the projection "
            "above the budget fires SandboxRouterProjectedOverspend.",
            query(f"max by (pool) ({spent})", "{{pool}} spent"),
            query(
                f"max by (pool) (sandbox_router_spend_projected_usd{{{POOL}}})",
                "{{pool}} projected",
                "B",
            ),
            query(
                f'max by (pool) (sandbox_router_quota_limit{{{POOL}, unit="usd"}})',
                "{{pool}} budget",
                "C",
            ),
        )
        .unit("currencyUSD")
        .span(8)
    )


BREAKER_MAPPINGS: list[ValueMapping] = [
    ValueMap(
        options={
            "0": ValueMappingResult(text="closed", color="green", index=0),
            "1": ValueMappingResult(text="half-open", color="yellow", index=1),
            "2": ValueMappingResult(text="open", color="red", index=2),
            "3": ValueMappingResult(text="blocked", color="purple", index=3),
        }
    )
]


def routing_dashboard() -> dash.Dashboard:
    board = base(
        "sandbox-router: Routing",
        "sandbox-router-routing",
        "Where acquisitions go, why they fail over, how long acquires and creates take, and "
        "each entry's health.",
    )
    board = board.with_row(dash.Row("Traffic"))
    board = board.with_panel(
        series(
            "Acquisitions by entry and outcome",
            "Acquires per second by the entry that served (none: no entry could).",
            query(
                "sum by (entry, outcome) (rate(sandbox_router_acquisitions_total"
                f'{{entry=~"$entry|none"}}[{RATE}]))',
                "{{entry}} {{outcome}}",
            ),
        ).unit("reqps")
    )
    board = board.with_panel(
        series(
            "Failovers by reason",
            "Failovers per second by the error class of the entry that failed.",
            query(
                f"sum by (reason) (rate(sandbox_router_failovers_total"
                f'{{from_entry=~"$entry"}}[{RATE}]))',
                "{{reason}}",
            ),
        ).unit("ops")
    )
    board = board.with_panel(
        series(
            "Failovers by route",
            "Failovers per second from the entry that failed to the next in the order.",
            query(
                f"sum by (from_entry, to_entry) (rate(sandbox_router_failovers_total"
                f'{{from_entry=~"$entry"}}[{RATE}]))',
                "{{from_entry}} → {{to_entry}}",
            ),
        ).unit("ops")
    )
    board = board.with_panel(
        series(
            "Failed creates and refunds",
            "Failed create attempts (retries included) and the reservations they refunded.",
            query(
                f"sum by (entry, reason) (rate(sandbox_router_create_failures_total{{{ENTRY}}}"
                f"[{RATE}]))",
                "{{entry}} {{reason}} failed",
            ),
            query(
                f"sum by (entry) (rate(sandbox_router_refunds_total{{{ENTRY}}}[{RATE}]))",
                "{{entry}} refunded",
                "B",
            ),
        ).unit("ops")
    )
    board = board.with_row(dash.Row("Latency"))
    acquire = [
        query(
            f"histogram_quantile({q}, sum by (le) (rate(sandbox_router_acquire_seconds_bucket"
            f"{{{ENTRY}}}[{RATE}])))",
            f"p{round(q * 100)}",
            ref,
        )
        for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))
    ]
    board = board.with_panel(
        series(
            "Acquire latency",
            "Whole acquire (retries and failovers included) of the acquires served by the "
            "selected entries: p50, p95, p99.",
            *acquire,
        ).unit("s")
    )
    create = [
        query(
            f"histogram_quantile({q}, sum by (le, entry) (rate(sandbox_router_create_seconds_bucket"
            f'{{{ENTRY}, outcome="success"}}[{RATE}])))',
            f"{{{{entry}}}} p{round(q * 100)}",
            ref,
        )
        for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))
    ]
    board = board.with_panel(
        series(
            "Create latency by entry",
            "One successful provider create: p50, p95, p99 per entry.",
            *create,
        ).unit("s")
    )
    board = board.with_row(dash.Row("Health"))
    board = board.with_panel(
        statetimeline.Panel()
        .title("Breaker state")
        .description(
            "Per entry: closed, half-open (probing), open, or blocked (misconfigured, provider "
            "quota exhausted, rate limited, at capacity, or not configured)."
        )
        .datasource(DS)
        .height(8)
        .span(12)
        .mappings(BREAKER_MAPPINGS)
        .show_value(common.VisibilityMode.AUTO)
        .merge_values(True)
        .thresholds(thresholds((None, "green")))
        .targets([query(f"max by (entry) (sandbox_router_breaker_state{{{ENTRY}}})", "{{entry}}")])
    )
    board = board.with_panel(
        series(
            "Live leases",
            "Unexpired leases per entry, fleet-wide.",
            query(f"max by (entry) (sandbox_router_live_leases{{{ENTRY}}})", "{{entry}}"),
        ).unit("short")
    )
    board = board.with_panel(
        series(
            "Breaker transitions",
            "Circuit transitions per entry and target state over each interval.",
            query(
                "sum by (entry, to_state) (increase(sandbox_router_breaker_transitions_total"
                f"{{{ENTRY}}}[{RATE}]))",
                "{{entry}} → {{to_state}}",
            ),
        ).unit("short")
    )
    board = board.with_panel(
        stat.Panel()
        .reduce_options(last_value())
        .title("Entries available")
        .description(
            "Entries that could serve now: configured, circuit closed or half-open, not "
            "blocked, quota left. Red at 0: every acquire fails."
        )
        .datasource(DS)
        .height(8)
        .span(6)
        .graph_mode(common.BigValueGraphMode.AREA)
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .thresholds(thresholds((None, "red"), (1, "green")))
        .targets(
            [
                query(
                    f"sum(max by (entry) (sandbox_router_entry_available{{{ENTRY}}}))",
                    "available",
                )
            ]
        )
    )
    return board.with_panel(
        series(
            "State store",
            "State store errors per second by operation, and whether the last scrape could "
            "read the shared state (1 up, 0 down).",
            query(
                f"sum by (operation) (rate(sandbox_router_state_errors_total[{RATE}]))",
                "{{operation}} errors",
            ),
            query("min(sandbox_router_state_up)", "store up", "B"),
        )
        .unit("short")
        .span(6)
    )


DASHBOARDS = {
    "sandbox-router-quota.json": quota_dashboard,
    "sandbox-router-routing.json": routing_dashboard,
}


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard (panels numbered in layout order)."""
    files = {}
    for name, build in DASHBOARDS.items():
        model = build().build()
        for number, panel in enumerate(model.panels or [], start=1):
            panel.id_val = number
        files[name] = json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail when a file is stale")
    parser.add_argument("--out", type=Path, default=OUT, help="output directory")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.out / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(
            f"stale: {', '.join(stale)} (run: python grafana/generate.py)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
