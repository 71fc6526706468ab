"""Read an ``EXITLIMIT_TELEMETRY`` file back: a text summary, and a plot of the crawl.

::

    python -m scrapy_exitlimit.report crawl.jsonl [--plot crawl.png]
    scrapy exitlimit-report crawl.jsonl [--plot crawl.png]

The plot needs matplotlib: ``pip install 'scrapy-exitlimit[plot]'``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .telemetry import ADJUST, ADMIT, RATES, RESPONSE

Record = dict[str, Any]
#: subplots in one figure; the quieter exits are named in a note
MAX_PLOTTED_EXITS = 12
BIN = 1.0  # seconds per rate bin
#: origin-wide and scope rates in the summary and the plot, the slowest (scopes may be many)
MAX_RATE_ROWS = 20
MAX_POOL_LINES = 8


def load(path: str | Path) -> tuple[list[Record], int]:
    """``(records, malformed)``: every well-formed record in file order, and how many
    lines were skipped (not JSON, not an object, no numeric ``t``, no ``ev``)."""
    records: list[Record] = []
    malformed = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                malformed += 1
                continue
            if (not isinstance(rec, dict) or not isinstance(rec.get("ev"), str)
                    or not _is_number(rec.get("t"))):
                malformed += 1
                continue
            records.append(rec)
    return records, malformed


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


@dataclass
class KeyStats:
    """What happened on one exit, or at one origin."""

    requests: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    admit_times: list[float] = field(default_factory=list)
    wait_sum: float = 0.0
    waits: int = 0
    #: last admitted rate per pair (the other half of the pair: origin for an exit row)
    last_rate: dict[str, float | None] = field(default_factory=dict)

    @property
    def responses(self) -> int:
        return sum(self.statuses.values())

    @property
    def rate_limited(self) -> int:
        return self.statuses.get("429", 0)

    @property
    def share_429(self) -> float | None:
        return self.rate_limited / self.responses if self.responses else None

    @property
    def mean_rate(self) -> float | None:
        """Admissions per second over this key's active span (first to last admission)."""
        ts = self.admit_times
        if len(ts) < 2:
            return None
        span = ts[-1] - ts[0]
        return (len(ts) - 1) / span if span > 0 else None

    @property
    def peak_rate(self) -> int:
        """Most admissions in one of the 1 s bins counted from the first admission."""
        if not self.admit_times:
            return 0
        t0 = self.admit_times[0]
        return max(Counter(int((t - t0) // BIN) for t in self.admit_times).values())

    @property
    def mean_wait(self) -> float | None:
        return self.wait_sum / self.waits if self.waits else None


def aggregate(records: Iterable[Record]) -> tuple[dict[str, KeyStats], dict[str, KeyStats]]:
    """``(per_exit, per_origin)`` statistics from records in time order."""
    exits: dict[str, KeyStats] = defaultdict(KeyStats)
    origins: dict[str, KeyStats] = defaultdict(KeyStats)
    for rec in sorted(records, key=lambda r: r["t"]):
        ev = rec["ev"]
        if ev not in (ADMIT, RESPONSE):
            continue
        exit_id, origin = str(rec.get("exit")), str(rec.get("origin"))
        for key_stats, other in ((exits[exit_id], origin), (origins[origin], exit_id)):
            if ev == ADMIT:
                key_stats.requests += 1
                key_stats.admit_times.append(rec["t"])
                if _is_number(rec.get("wait")):
                    key_stats.wait_sum += rec["wait"]
                    key_stats.waits += 1
                rate = rec.get("rate")
                key_stats.last_rate[other] = rate if _is_number(rate) else None
            else:
                status = rec.get("status")
                key_stats.statuses[str(status) if _is_number(status) else "error"] += 1
    return dict(exits), dict(origins)


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _rates(last: dict[str, float | None]) -> str:
    known = [r for r in last.values() if r is not None]
    if not known:
        return "-" if not last else "none"
    lo, hi = min(known), max(known)
    return f"{lo:.3g}" if lo == hi else f"{lo:.3g}..{hi:.3g}"


def _statuses(statuses: Counter[str]) -> str:
    def order(item: tuple[str, int]) -> tuple[int, str]:
        return (0, item[0]) if item[0].isdigit() else (1, item[0])

    return " ".join(f"{s}:{n}" for s, n in sorted(statuses.items(), key=order)) or "-"


def _table(title: str, rows: dict[str, KeyStats]) -> list[str]:
    header = (f"{title:<28} {'requests':>8} {'429s':>5} {'429 %':>6} {'mean r/s':>8} "
              f"{'peak r/s':>8} {'last rate':>10} {'mean wait':>9}  responses by status")
    lines = [header, "-" * len(header)]
    for key, st in sorted(rows.items(), key=lambda kv: (-kv[1].requests, kv[0])):
        share = st.share_429
        lines.append(
            f"{key:<28} {st.requests:>8} {st.rate_limited:>5} "
            f"{_fmt(None if share is None else 100 * share, '.1f'):>6} "
            f"{_fmt(st.mean_rate):>8} {st.peak_rate:>8} {_rates(st.last_rate):>10} "
            f"{_fmt(st.mean_wait, '.3f'):>9}  {_statuses(st.statuses)}")
    return lines


def _rates_table(paced: dict[str, tuple[list[float], list[float]]]) -> list[str]:
    header = f"{'origin-wide / scope rate':<40} {'lowest':>7} {'last':>7}"
    lines = [header, "-" * len(header)]
    labels = slowest_first(paced)
    for label in labels[:MAX_RATE_ROWS]:
        ys = paced[label][1]
        lowest = min(y for y in ys if not math.isnan(y))
        last = "none" if math.isnan(ys[-1]) else format(ys[-1], ".3g")
        lines.append(f"{label:<40} {lowest:>7.3g} {last:>7}")
    if len(labels) > MAX_RATE_ROWS:
        lines.append(f"... and {len(labels) - MAX_RATE_ROWS} more")
    return lines


def summarize(records: Sequence[Record], malformed: int = 0) -> str:
    """A text summary: one table per exit, one per origin, the origin-wide and scope rates
    (slowest first), and the adjustments by kind.

    ``last rate`` is the pair rate (r/s) at the last admission of each pair
    (a range when the row has several pairs); ``mean wait`` in seconds parked. An
    origin-wide or scope rate's ``lowest`` and ``last`` are in r/s (``none``: it no
    longer limited at the end).
    """
    if not records:
        return "no telemetry records" + (f" ({malformed} malformed lines skipped)"
                                         if malformed else "")
    times = [r["t"] for r in records]
    exits, origins = aggregate(records)
    adjustments = Counter(str(r.get("kind")) for r in records if r["ev"] == ADJUST)
    lines = [f"{len(records)} records over {max(times) - min(times):.1f} s, "
             f"{len(exits)} exits, {len(origins)} origins"]
    if malformed:
        lines[0] += f" ({malformed} malformed lines skipped)"
    lines += ["", *_table("exit", exits), "", *_table("origin", origins)]
    paced = pool_rates(records)
    if paced:
        lines += ["", *_rates_table(paced)]
    if adjustments:
        lines += ["", "adjustments: " + ", ".join(
            f"{kind} {n}" for kind, n in sorted(adjustments.items(), key=lambda kv: -kv[1]))]
    return "\n".join(lines)


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("the plot needs matplotlib: "
                              "pip install 'scrapy-exitlimit[plot]'") from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


#: kinds of trouble, as the plot marks them: (marker, colour, what it is)
EVENT_MARKS: dict[str, tuple[str, str, str]] = {
    "429": ("x", "#d62728", "429 (pair cooling down)"),
    "ban": ("s", "#000000", "ban (403 / block page)"),
    "eviction": ("v", "#9467bd", "exit evicted (proxy faults)"),
    "breaker": ("D", "#ff7f0e", "circuit breaker open"),
    "fault": ("+", "#8c564b", "proxy fault"),
    "503": ("^", "#1f77b4", "503 (origin overloaded)"),
}
#: adjust kinds (telemetry ``kind``) and response signals that are trouble, by mark
_ADJUST_MARKS = {"pair_banned": "ban", "evicted": "eviction", "breaker_open": "breaker"}
_SIGNAL_MARKS = {"proxy_fault": "fault", "overloaded": "503"}
#: above this many exits, the plot adds a heat map of the whole pool
HEATMAP_ABOVE = 12
#: most time columns in the heat map (columns widen for long crawls, so that a slow
#: exit's rate is a colour, not a comb of 0s and 1s)
HEATMAP_COLUMNS = 60


@dataclass
class ExitTrack:
    """What the plot draws for one exit."""

    admits: list[tuple[float, str, float | None]] = field(default_factory=list)
    marks: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    last_seen: float = -math.inf

    @property
    def trouble(self) -> tuple[int, int]:
        """(kinds of trouble, trouble events): what ranks an exit ahead of busier ones."""
        return sum(1 for ts in self.marks.values() if ts), sum(map(len, self.marks.values()))


def tracks(records: Iterable[Record]) -> dict[str, ExitTrack]:
    """Per exit: admissions ``(t, origin, pair rate)``, trouble marks by kind, last record."""
    out: dict[str, ExitTrack] = defaultdict(ExitTrack)
    for rec in records:
        exit_id = rec.get("exit")
        if exit_id is None:
            continue
        track = out[str(exit_id)]
        t = rec["t"]
        track.last_seen = max(track.last_seen, t)
        ev = rec["ev"]
        if ev == ADMIT:
            rate = rec.get("rate")
            track.admits.append((t, str(rec.get("origin")), rate if _is_number(rate) else None))
        elif ev == RESPONSE:
            if rec.get("status") == 429:
                track.marks["429"].append(t)
            elif (kind := _SIGNAL_MARKS.get(str(rec.get("signal")))) is not None:
                track.marks[kind].append(t)
        elif ev == ADJUST and (kind := _ADJUST_MARKS.get(str(rec.get("kind")))) is not None:
            track.marks[kind].append(t)
    return dict(out)


#: trouble that takes an exit out of the pool (for an origin, or everywhere)
_SEVERE = ("ban", "eviction", "breaker")


def rank_exits(by_exit: dict[str, ExitTrack]) -> list[str]:
    """Trouble first: most kinds of trouble, then bans / evictions / breakers, then most
    trouble events; then the busiest."""
    def key(exit_id: str) -> tuple[int, int, int, int, str]:
        track = by_exit[exit_id]
        kinds, events = track.trouble
        severe = sum(len(track.marks.get(kind, ())) for kind in _SEVERE)
        return (-kinds, -severe, -events, -len(track.admits), exit_id)

    return sorted(by_exit, key=key)


def pick_exits(by_exit: dict[str, ExitTrack], ranked: list[str], room: int) -> list[str]:
    """``room`` exits to draw in detail, taken in turn from each kind of trouble there was
    (the set of marks an exit has: banned, evicted and faulty, cooling down, ..., clean),
    each kind in ``ranked`` order: a pool whose hundred dead sessions top the ranking
    still shows its banned, slow and healthy exits."""
    groups: dict[frozenset[str], list[str]] = {}
    for exit_id in ranked:
        signature = frozenset(k for k, ts in by_exit[exit_id].marks.items() if ts)
        groups.setdefault(signature, []).append(exit_id)
    picked: list[str] = []
    queues = [list(reversed(group)) for group in groups.values()]
    while len(picked) < room and any(queues):
        for queue in queues:
            if queue and len(picked) < room:
                picked.append(queue.pop())
    order = {e: i for i, e in enumerate(ranked)}
    return sorted(picked, key=order.__getitem__)


def pool_rates(records: Iterable[Record]) -> dict[str, tuple[list[float], list[float]]]:
    """Rates wider than a pair, by label, from the ``rates`` records: ``origin rate
    <origin>`` from ``origin_rate``, ``scope <scope id>`` from ``scope_rate``. A null (no
    longer limited) after a rate is NaN: a gap in the line. Telemetry written before
    ``rates`` records existed gives nothing."""
    lines: dict[str, tuple[list[float], list[float]]] = {}
    for rec in sorted(records, key=lambda r: r["t"]):
        if rec["ev"] != RATES:
            continue
        if "origin_rate" in rec:
            label, value = f"origin rate {rec.get('origin')}", rec["origin_rate"]
        elif "scope_rate" in rec:
            label, value = f"scope {rec.get('scope')}", rec["scope_rate"]
        else:
            continue
        if value is None and label in lines:
            value = math.nan
        elif not _is_number(value):
            continue
        xs, ys = lines.setdefault(label, ([], []))
        xs.append(rec["t"])
        ys.append(float(value))
    return lines


def slowest_first(lines: dict[str, tuple[list[float], list[float]]]) -> list[str]:
    """The labels of :func:`pool_rates` by the lowest rate each reached: the scopes and
    origins that held the crawl back most come first."""
    def lowest(label: str) -> float:
        return min((y for y in lines[label][1] if not math.isnan(y)), default=math.inf)

    return sorted(lines, key=lambda label: (lowest(label), label))


def plot(records: Sequence[Record], out_png: str | Path,
         max_exits: int = MAX_PLOTTED_EXITS, title: str | None = None) -> list[str]:
    """Draw the crawl; returns the exits drawn in detail.

    - above :data:`HEATMAP_ABOVE` exits, a heat map of the whole pool: one row per exit
      (trouble first), colour = admissions per second, marks for 429s, bans, evictions;
    - the pool: admissions per second over all exits, and the origin-wide and scope
      rates when the telemetry has them (the :data:`MAX_POOL_LINES` slowest);
    - one panel per exit for up to ``max_exits`` exits, trouble first (429s, bans,
      evictions, breakers, faults), then the busiest; how many were left out is said
      on the figure. Panels share one y scale; an exit's lines stop when it was last
      seen (banned, evicted, or the crawl ended); every kind of event has its marker.
    """
    plt = _pyplot()
    by_exit = tracks(records)
    ranked = rank_exits(by_exit)
    shown = pick_exits(by_exit, ranked, max_exits)
    rest = [e for e in ranked if e not in set(shown)]
    t0 = min((r["t"] for r in records), default=0.0)
    end = max(BIN, max((r["t"] for r in records), default=t0) - t0)
    heat = len(ranked) > HEATMAP_ABOVE
    # a large pool's exits are slow each: their bars use the heat map's columns
    width = _column_width(by_exit, end) if heat else BIN
    nbins = max(1, math.ceil(end / width))
    edges = [i * width for i in range(nbins + 1)]

    cols = 2 if len(shown) > 6 else 1
    detail_rows = max(1, math.ceil(len(shown) / cols))
    heights = ([6.0] if heat else []) + [2.2, 0.25] + [1.5] * detail_rows
    fig = plt.figure(figsize=(7 * cols if cols == 2 else 11, sum(heights) + 1.4))
    grid = fig.add_gridspec(len(heights), cols, height_ratios=heights, hspace=0.55,
                            wspace=0.12)
    row = 0
    if heat:
        _heatmap(plt, fig, fig.add_subplot(grid[row, :]), by_exit, ranked, t0, end, width)
        row += 1
    pool_ax = fig.add_subplot(grid[row, :])
    _pool_panel(pool_ax, by_exit, records, t0, _edges(end, BIN))
    spacer = fig.add_subplot(grid[row + 1, :])
    spacer.axis("off")
    row += 2

    detail = [fig.add_subplot(grid[row + i // cols, i % cols]) for i in range(len(shown))]
    counts = {e: _binned([t - t0 for t, _, _ in by_exit[e].admits], nbins, width)
              for e in shown}
    top = max([max(c) for c in counts.values()] + [r for e in shown
              for _, _, r in by_exit[e].admits if r is not None] + [0.1])
    for i, (ax, exit_id) in enumerate(zip(detail, shown, strict=True)):
        _exit_panel(ax, by_exit[exit_id], exit_id, counts[exit_id], edges, t0, end, width)
        ax.set_ylim(0, top * 1.15)  # one scale for every exit
        if i % cols:
            ax.tick_params(labelleft=False)
        else:
            ax.set_ylabel("r/s")
        if i < len(shown) - cols:
            ax.tick_params(labelbottom=False)
        else:
            ax.set_xlabel("seconds since start")
    left_out = (f"; {len(rest)} left out (all of them: the text report)" if rest
                else "; none left out")
    spacer.text(0, 0, f"exits in detail: {len(shown)} of {len(ranked)}, trouble first (each "
                f"kind of trouble, then bans, evictions, 429s), then busiest{left_out}",
                transform=spacer.transAxes, fontsize=9, fontweight="bold", va="bottom")
    handles = [plt.Rectangle((0, 0), 1, 1, alpha=0.35, color="C0", label="admitted r/s"),
               plt.Line2D([], [], color="C1", label="pair rate"),
               *[plt.Line2D([], [], linestyle="", marker=m, color=c, label=label,
                            markersize=7) for m, c, label in EVENT_MARKS.values()]]
    fig.legend(handles=handles, loc="upper center", ncol=4, fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1 - 0.45 / fig.get_figheight()))
    fig.suptitle(title or f"{len(ranked)} exits over {end:.0f} s", fontsize=11,
                 y=1 - 0.12 / fig.get_figheight())
    fig.subplots_adjust(top=1 - 1.2 / fig.get_figheight(), bottom=0.5 / fig.get_figheight(),
                        left=0.07, right=0.98)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return shown


def _edges(end: float, width: float) -> list[float]:
    return [i * width for i in range(max(1, math.ceil(end / width)) + 1)]


def _binned(xs: Sequence[float], nbins: int, width: float = BIN) -> list[float]:
    counts = [0] * nbins
    for x in xs:
        counts[min(nbins - 1, max(0, int(x // width)))] += 1
    return [c / width for c in counts]


#: y position (axes fraction) of each kind's row of marks in an exit's panel
_MARK_ROWS = {kind: 0.93 - 0.085 * i for i, kind in enumerate(EVENT_MARKS)}


def _exit_panel(ax: Any, track: ExitTrack, exit_id: str, counts: list[float],
                edges: list[float], t0: float, end: float, width: float) -> None:
    gone = track.last_seen - t0
    last_bin = min(len(counts), int(gone // width) + 1)
    ax.stairs(counts[:last_bin], edges[:last_bin + 1], fill=True, alpha=0.35, color="C0")
    lines: dict[str, tuple[list[float], list[float]]] = {}
    for t, origin, rate in track.admits:
        if rate is not None:
            xs, ys = lines.setdefault(origin, ([], []))
            xs.append(t - t0)
            ys.append(rate)
    for origin, (xs, ys) in lines.items():
        ax.step([*xs, gone], [*ys, ys[-1]], where="post", linewidth=1.2,
                color="C1" if len(lines) == 1 else None, label=f"rate {origin}")
    if len(lines) > 1:
        ax.legend(fontsize=6, loc="upper right")
    transform = ax.get_xaxis_transform()
    for kind, times in track.marks.items():
        marker, colour, _ = EVENT_MARKS[kind]
        ax.plot([t - t0 for t in times], [_MARK_ROWS[kind]] * len(times), linestyle="",
                marker=marker, color=colour, markersize=5, transform=transform)
    if gone < end - 2 * BIN:
        ax.axvline(gone, color="#999999", linewidth=0.8, linestyle=":")
    trouble = ", ".join(f"{len(ts)} {k}" for k, ts in track.marks.items() if ts)
    parts = [f"{len(track.admits)} admitted"] + ([trouble] if trouble else [])
    if gone < end - 2 * BIN:
        parts.append(f"last seen at {gone:.0f} s")
    ax.set_title(f"{exit_id}  ({', '.join(parts)})", fontsize=8, loc="left")
    ax.set_xlim(0, end)


def _pool_panel(ax: Any, by_exit: dict[str, ExitTrack], records: Sequence[Record],
                t0: float, edges: list[float]) -> None:
    nbins = len(edges) - 1
    everything = [t - t0 for track in by_exit.values() for t, _, _ in track.admits]
    ax.stairs(_binned(everything, nbins), edges, fill=True, alpha=0.35, color="#2ca02c",
              label="admitted r/s, whole pool")
    paced = pool_rates(records)
    labels = slowest_first(paced)
    for label in labels[:MAX_POOL_LINES]:
        xs, ys = paced[label]
        ax.step([x - t0 for x in xs] + [edges[-1]], [*ys, ys[-1]], where="post",
                linewidth=1.4, label=label)
    ax.set_xlim(0, edges[-1])
    ax.set_ylim(bottom=0)
    ax.set_ylabel("r/s")
    ax.set_xlabel("seconds since start", fontsize=8)
    more = len(labels) - MAX_POOL_LINES
    ax.set_title("the pool" + (f" ({more} faster scope or origin rates left out: the text "
                               "report)" if more > 0 else ""),
                 fontsize=9, loc="left", fontweight="bold")
    ax.legend(fontsize=7, loc="upper right")


def _column_width(by_exit: dict[str, ExitTrack], end: float) -> float:
    """Seconds per heat-map column: wide enough for a request or two of a typical exit (a
    rate is a colour, not a comb of 0s and 1s), at most :data:`HEATMAP_COLUMNS` columns,
    at least 16."""
    rates = sorted(len(t.admits) / max(BIN, t.admits[-1][0] - t.admits[0][0])
                   for t in by_exit.values() if len(t.admits) > 1)
    typical = rates[len(rates) // 2] if rates else 1.0
    width = max(end / HEATMAP_COLUMNS, 1.5 / typical)
    width = min(width, max(BIN, end / 16))
    return max(BIN, math.ceil(width / BIN) * BIN)


def _heatmap(plt: Any, fig: Any, ax: Any, by_exit: dict[str, ExitTrack], ranked: list[str],
             t0: float, end: float, width: float) -> None:
    ncols = max(1, math.ceil(end / width))
    matrix = []
    for exit_id in ranked:
        track = by_exit[exit_id]
        row = _binned([t - t0 for t, _, _ in track.admits], ncols, width)
        gone = int((track.last_seen - t0) // width) + 1
        matrix.append([v if i < gone else math.nan for i, v in enumerate(row)])
    cmap = plt.get_cmap("viridis").with_extremes(bad="#e6e6e6")  # after it was last seen
    image = ax.imshow(matrix, aspect="auto", interpolation="nearest", cmap=cmap,
                      extent=(0, ncols * width, len(ranked), 0))
    size = 30 if len(ranked) <= 50 else 8 if len(ranked) <= 300 else 4
    for kind in ("429", "ban", "eviction", "breaker", "fault"):
        marker, colour, _ = EVENT_MARKS[kind]
        xs, ys = [], []
        for y, exit_id in enumerate(ranked):
            times = by_exit[exit_id].marks.get(kind, ())
            # one mark per exit and cell: 1,000 exits' 429s stay readable
            for col in sorted({int((t - t0) // width) for t in times}):
                xs.append((col + 0.5) * width)
                ys.append(y + 0.5)
        if xs:
            ax.scatter(xs, ys, marker=marker, s=size, c=colour if marker in "x+" else "none",
                       edgecolors=None if marker in "x+" else colour, linewidths=0.7)
    ax.set_xlim(0, ncols * width)
    ax.set_ylabel(f"{len(ranked)} exits, trouble first")
    if len(ranked) <= 40:
        ax.set_yticks([i + 0.5 for i in range(len(ranked))], ranked, fontsize=6)
    ax.set_title(f"the whole pool: admissions per second per exit ({width:g} s columns; "
                 "grey: after the exit was last seen)", fontsize=9, loc="left",
                 fontweight="bold")
    bar = fig.colorbar(image, ax=ax, pad=0.01, fraction=0.03)
    bar.set_label("admitted r/s", fontsize=8)


def run(path: str | Path, plot_to: str | Path | None = None, out: Any = None) -> int:
    """The CLI's work: print the summary (and write the plot); the exit status."""
    out = out or sys.stdout
    try:
        records, malformed = load(path)
    except OSError as exc:
        print(f"cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(summarize(records, malformed), file=out)
    if plot_to is not None:
        try:
            shown = plot(records, plot_to)
        except PlotUnavailable as exc:
            print(str(exc), file=sys.stderr)
            return 1
        print(f"\nplot written to {plot_to} ({len(shown)} exit(s) in detail)", file=out)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plot", metavar="OUT.png", default=None,
                        help="also draw the pool (a heat map above 12 exits) and the exits in "
                             "trouble first, with 429s, bans, evictions and faults marked, "
                             "to this PNG")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scrapy_exitlimit.report",
                                     description="Summarize an EXITLIMIT_TELEMETRY file.")
    parser.add_argument("telemetry", metavar="TELEMETRY", help="the .jsonl file")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args.telemetry, args.plot)


if __name__ == "__main__":
    sys.exit(main())
