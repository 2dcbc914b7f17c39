"""The readable table, the gateway / bare (and / peer) ratios, and the targets with pass or fail."""

from __future__ import annotations

from typing import Any

MiB = 2**20

# (scenario, label, path into the figures, scale). A path is dotted; "steps[-1]."
# reaches the last idle step.
ROWS: list[tuple[str, str, str, float]] = [
    ("connect", "hellos/s", "hellos_per_s", 1),
    ("connect", "handshake p50 (ms)", "handshake.p50_ms", 1),
    ("connect", "handshake p99 (ms)", "handshake.p99_ms", 1),
    ("connect", "server CPU per hello (us)", "server_cpu_us_per_op", 1),
    ("idle", "computers held", "computers", 1),
    ("idle", "RSS before (MiB)", "rss_before_bytes", 1 / MiB),
    ("idle", "RSS with all (MiB)", "steps[-1].rss_bytes", 1 / MiB),
    ("idle", "bytes per computer", "bytes_per_computer", 1),
    ("idle", "marginal bytes per computer", "marginal_bytes_per_computer", 1),
    ("idle", "idle CPU (% of a core)", "idle_cpu_pct", 1),
    ("health", "concurrency (computers x in flight)", "concurrency", 1),
    ("health", "round trips/s", "round_trips_per_s", 1),
    ("health", "p50 (ms)", "latency.p50_ms", 1),
    ("health", "p99 (ms)", "latency.p99_ms", 1),
    ("health", "max (ms)", "latency.max_ms", 1),
    ("health", "server CPU per round trip (us)", "server_cpu_us_per_op", 1),
    ("health", "opencode requests made", "opencode_requests", 1),
    ("burst", "computers", "computers", 1),
    ("burst", "answered", "answered", 1),
    ("burst", "opencode requests made", "opencode_requests", 1),
    ("burst", "time to last answer (ms)", "time_to_last_answer_ms", 1),
    ("burst", "server CPU per call (us)", "server_cpu_us_per_op", 1),
    ("ping", "pings/s (HTTP POST -> computer)", "pings_per_s", 1),
    ("ping", "p50 (ms)", "latency.p50_ms", 1),
    ("ping", "p99 (ms)", "latency.p99_ms", 1),
    ("ping", "server CPU per ping (us)", "server_cpu_us_per_op", 1),
    ("opws", "requests/s (one /operator WebSocket a client)", "requests_per_s", 1),
    ("opws", "p50 (ms)", "latency.p50_ms", 1),
    ("opws", "p99 (ms)", "latency.p99_ms", 1),
    ("opws", "server CPU per request (us)", "server_cpu_us_per_op", 1),
    ("churn", "cycles completed", "completed", 1),
    ("churn", "cycles/s", "cycles_per_s", 1),
    ("churn", "cycle p99 (ms)", "cycle.p99_ms", 1),
    ("churn", "server CPU per cycle (us)", "server_cpu_us_per_op", 1),
    ("churn", "registry at end", "registered_end", 1),
    ("churn", "RSS after 1st checkpoint (MiB)", "rss_checkpoint_bytes", 1 / MiB),
    ("churn", "RSS at end (MiB)", "rss_end_bytes", 1 / MiB),
    ("churn", "RSS growth since checkpoint (%)", "rss_growth_since_checkpoint_pct", 1),
    ("slowreader", "others' health answers", "answered", 1),
    ("slowreader", "others' health p99 (ms)", "latency.p99_ms", 1),
    ("slowreader", "RSS growth, peak (MiB)", "rss_growth_mib", 1),
]
# Shown for every scenario.
COMMON = [
    ("server CPU (% of its core)", "server_cpu_pct", 1),
    ("generator CPU (% of its core)", "generator_cpu_pct", 1),
    ("fake opencode CPU (%)", "fake_opencode_cpu_pct", 1),
    ("other processes CPU (%)", "other_cpu_pct", 1),
]
ORDER = ("connect", "idle", "health", "burst", "ping", "opws", "churn", "slowreader")


def get(figures: dict[str, Any] | None, path: str) -> Any:
    value: Any = figures
    for part in path.split("."):
        if value is None:
            return None
        if part.endswith("[-1]"):
            value = value.get(part[:-4]) or []
            value = value[-1] if value else None
        else:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# The sides besides the gateway, in the order they are shown.
OTHERS = ("bare", "fastify")


def _others(results: dict[str, dict[str, Any]]) -> list[str]:
    """bare, then the gateway's other modes (``gateway-plain``, ``gateway-without-...``), peers."""
    modes = [side for side in results if side.startswith("gateway-")]
    return (
        [side for side in OTHERS[:1] if side in results]
        + modes
        + [side for side in OTHERS[1:] if side in results]
    )


def _short(side: str) -> str:
    """A side's name in a ratio's column header."""
    known = {"gateway": "gw", "bare": "bare", "fastify": "node", "gateway-plain": "plain"}
    return known.get(side) or side.replace("gateway-without-", "-")


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """gateway / bare as ``"scenario: label"``; gateway / a peer as ``"peer: scenario: label"``."""
    gateway = results.get("gateway", {})
    out = {}
    for side in _others(results):
        other = results[side]
        prefix = (
            "" if side == "bare" else f"{_short(side) if side.startswith('gateway-') else side}: "
        )
        for scenario, label, path, _ in ROWS:
            g, b = get(gateway.get(scenario), path), get(other.get(scenario), path)
            if _number(g) and _number(b) and b:
                out[f"{prefix}{scenario}: {label}"] = round(g / b, 3)
    return out


def _format(value: Any, scale: float = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if _number(value):
        value = value * scale
        if abs(value) >= 100 or float(value).is_integer():
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:,.1f}"
        return f"{value:,.2f}"
    return str(value)


def table(document: dict[str, Any]) -> str:
    results = document["results"]
    sides = ["gateway", *_others(results)]
    rows: list[tuple[str, ...]] = []
    notes: list[str] = list(document.get("peer_notes") or [])
    for scenario in ORDER:
        figures = [results.get(side, {}).get(scenario) for side in sides]
        if all(f is None for f in figures):
            continue
        for fig, target in zip(figures, sides, strict=True):
            if not fig:
                continue
            for key in ("failed", "skipped", "note"):
                if fig.get(key):
                    notes.append(f"{scenario} ({target}): {fig[key]}")
            if fig.get("errors"):
                notes.append(f"{scenario} ({target}): errors {fig['errors']}")
        name = scenario
        for _, label, path, scale in [r for r in ROWS if r[0] == scenario] + [
            (scenario, *c) for c in COMMON
        ]:
            values = [get(fig, path) for fig in figures]
            if all(v is None for v in values):
                continue
            g = values[0]
            shown = [_format(v, scale) for v in values]
            shown += [f"{g / v:.2f}" if _number(g) and _number(v) and v else "" for v in values[1:]]
            rows.append((name, label, *shown))
            name = ""
        bottleneck = [get(fig, "bottleneck") for fig in figures]
        if any(bottleneck):
            rows.append(
                ("", "bottleneck", *(_format(v) for v in bottleneck), *[""] * (len(sides) - 1))
            )
    header = ("scenario", "figure", *sides, *(f"gw/{_short(s)}" for s in sides[1:]))
    columns = len(header)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(columns)]

    def line(r) -> str:
        return "  ".join(
            r[i].ljust(widths[i]) if i < 2 else r[i].rjust(widths[i]) for i in range(columns)
        ).rstrip()

    out = [line(header), line(tuple("-" * w for w in widths))]
    out += [line(r) for r in rows]
    if notes:
        out += ["", "notes:"] + [f"  - {n}" for n in notes]
    if document.get("server_log_errors"):
        out += ["", "errors in server logs:"]
        for label, lines in document["server_log_errors"].items():
            out += [f"  {label}: {text}" for text in lines[:5]]
    out += ["", "targets:"]
    for t in document["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
        scale = "" if t.get("conclusive", True) else " (too small a run to conclude)"
        out.append(f"  [{verdict}] {t['target']}: {t['measured']}{scale}")
    machine = document["machine"]
    out += [
        "",
        f"machine: {machine['cores']} cores ({machine['cpu_model']}), Python {machine['python']}, "
        + ", ".join(f"{k} {v}" for k, v in machine["packages"].items() if v),
        f"pinning: server on CPU {document['pinning']['server_cpu']}, generator and fake "
        f"opencode on CPU {document['pinning']['generator_and_fake_opencode_cpu']}; "
        f"run took {document['runtime_s']} s",
    ]
    return "\n".join(out)


def targets(results: dict[str, dict[str, Any]], quick: bool = False) -> list[dict[str, Any]]:
    gateway, bare = results.get("gateway", {}), results.get("bare", {})
    out = []

    def add(target: str, passed: bool | None, measured: str, conclusive: bool = True) -> None:
        out.append(
            {
                "target": target,
                "pass": passed,
                "measured": measured,
                "conclusive": conclusive and not quick,
            }
        )

    g, b = (
        get(gateway.get("health"), "round_trips_per_s"),
        get(bare.get("health"), "round_trips_per_s"),
    )
    if _number(g) and _number(b) and b:
        add(
            "health round trips/s >= 0.6 x bare echo round trips/s",
            g >= 0.6 * b,
            f"{g:,.0f} vs {b:,.0f} /s = {g / b:.2f} x",
        )
    else:
        add("health round trips/s >= 0.6 x bare echo round trips/s", None, "not measured")

    g_idle, b_idle = gateway.get("idle"), bare.get("idle")
    g, b = get(g_idle, "bytes_per_computer"), get(b_idle, "bytes_per_computer")
    if _number(g) and _number(b) and b:
        add(
            "bytes per idle computer <= 1.25 x bare bytes per idle connection",
            g <= 1.25 * b,
            f"{g:,} vs {b:,} B = {g / b:.2f} x (at {get(g_idle, 'computers'):,} computers)",
            (get(g_idle, "computers") or 0) >= 1000,
        )
    else:
        add("bytes per idle computer <= 1.25 x bare", None, "not measured")

    burst = gateway.get("burst")
    if burst and "opencode_requests" in burst:
        add(
            "burst: 1,000 concurrent health calls -> at most 2 opencode requests, all answered",
            burst["opencode_requests"] <= 2 and bool(burst.get("all_answered")),
            f"{burst['answered']:,} of {burst['computers']:,} answered, "
            f"{burst['opencode_requests']} opencode requests, last answer after "
            f"{burst['time_to_last_answer_ms']:,.0f} ms",
            burst["computers"] >= 1000,
        )
    else:
        add("burst: at most 2 opencode requests, all answered", None, "not measured")

    if g_idle and _number(g_idle.get("idle_cpu_pct")):
        add(
            "10,000 idle computers on one process under 2 % of a core",
            g_idle["idle_cpu_pct"] < 2.0 and g_idle.get("computers", 0) >= 10000,
            f"{g_idle['idle_cpu_pct']:.2f} % of a core with {g_idle['computers']:,} computers "
            f"over {g_idle['idle_window_s']:g} s",
            g_idle.get("computers", 0) >= 10000,
        )
    else:
        add("10,000 idle computers under 2 % of a core", None, "not measured")

    churn = gateway.get("churn")
    if churn and _number(churn.get("rss_growth_since_checkpoint_pct")):
        growth = churn["rss_growth_since_checkpoint_pct"]
        add(
            "churn: after 20,000 cycles the registry is empty and RSS within 5 % of its level "
            "after 1,000",
            churn.get("registered_end") == 0
            and abs(growth) <= 5.0
            and churn["completed"] >= churn["cycles"],
            f"{churn['completed']:,} cycles, registry {churn.get('registered_end')}, RSS "
            f"{growth:+.2f} % since cycle {churn['checkpoint_cycles']:,}",
            churn["completed"] >= 20000,
        )
    else:
        add("churn leaves no leak", None, "not measured")

    plain = results.get("gateway-plain")
    if plain:
        # Issue 20: each fast path earns its place against the plain gateway, same run.
        for scenario, path, label, want in PLAIN_TARGETS:
            g, p = get(gateway.get(scenario), path), get(plain.get(scenario), path)
            name = f"vs plain: {label} >= {want:g} x the plain gateway's"
            if _number(g) and _number(p) and p:
                add(name, g / p >= want, f"{_format(g)} vs {_format(p)} = {g / p:.2f} x")
            else:
                add(name, None, "not measured")

    node = results.get("fastify")
    if node:
        # Issue 15: against the Node build of the same design, in the same run.
        for scenario, path, label, op, want in PEER_TARGETS:
            g, n = get(gateway.get(scenario), path), get(node.get(scenario), path)
            name = f"vs Node: {label} {op} {want:g} x the Node peer's"
            if _number(g) and _number(n) and n:
                ratio = g / n
                add(
                    name,
                    ratio >= want if op == ">=" else ratio <= want,
                    f"{_format(g)} vs {_format(n)} = {ratio:.2f} x",
                )
            else:
                add(name, None, "not measured")
    return out


# Issue 15's targets, gateway / Node: (scenario, figure, label, comparison, ratio).
PEER_TARGETS = (
    ("connect", "hellos_per_s", "hellos/s", ">=", 1.0),
    ("connect", "server_cpu_us_per_op", "server CPU per hello", "<=", 1.0),
    ("ping", "pings_per_s", "operator requests/s", ">=", 1.0),
    ("health", "round_trips_per_s", "health round trips/s", ">=", 3.0),
    ("churn", "cycles_per_s", "churn cycles/s", ">=", 1.0),
    ("idle", "bytes_per_computer", "bytes per idle computer", "<=", 1.0),
)

# Issue 20's targets, fast gateway / plain gateway: (scenario, figure, label, ratio).
PLAIN_TARGETS = (
    ("ping", "pings_per_s", "the fast operator reader's requests/s", 1.3),
    ("health", "round_trips_per_s", "the frame path's health round trips/s", 1.2),
    ("connect", "hellos_per_s", "the frame path's hellos/s", 1.2),
)
