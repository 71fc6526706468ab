"""Read an ``EXITLIMIT_TELEMETRY`` file back: a text summary, and a plot per exit.

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

from .telemetry import ADJUST, ADMIT, RESPONSE

Record = dict[str, Any]
#: subplots in one figure; the quieter exits are named in a note
MAX_PLOTTED_EXITS = 12
BIN = 1.0  # seconds per rate bin


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


def summarize(records: Sequence[Record], malformed: int = 0) -> str:
    """A text summary: one table per exit, one per origin, and the adjustments by kind.

    ``last rate`` is the pair rate (r/s) at the last admission of each pair
    (a range when the row has several pairs); ``mean wait`` in seconds parked.
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


def plot(records: Sequence[Record], out_png: str | Path,
         max_exits: int = MAX_PLOTTED_EXITS) -> list[str]:
    """One subplot per exit (the busiest ``max_exits``): admissions per 1 s bin,
    each pair's rate as a step line, 429 answers as red x. Returns the exits plotted."""
    plt = _pyplot()
    admits: dict[str, list[Record]] = defaultdict(list)
    rejected: dict[str, list[float]] = defaultdict(list)
    for rec in records:
        if rec["ev"] == ADMIT:
            admits[str(rec.get("exit"))].append(rec)
        elif rec["ev"] == RESPONSE and rec.get("status") == 429:
            rejected[str(rec.get("exit"))].append(rec["t"])
    ranked = sorted(set(admits) | set(rejected), key=lambda e: (-len(admits[e]), e))
    shown, rest = ranked[:max_exits], ranked[max_exits:]
    t0 = min((r["t"] for r in records), default=0.0)
    end = max((r["t"] for r in records), default=t0) - t0
    nbins = max(1, int(end // BIN) + 1)

    rows = max(1, len(shown))
    fig, axes = plt.subplots(rows, 1, figsize=(10, 1.0 + 2.0 * rows), sharex=True,
                             squeeze=False)
    for ax, exit_id in zip(axes[:, 0], shown, strict=False):
        counts = [0] * nbins
        rate_lines: dict[str, tuple[list[float], list[float]]] = {}
        for rec in sorted(admits[exit_id], key=lambda r: r["t"]):
            x = rec["t"] - t0
            counts[min(nbins - 1, int(x // BIN))] += 1
            rate = rec.get("rate")
            if _is_number(rate):
                xs, ys = rate_lines.setdefault(str(rec.get("origin")), ([], []))
                xs.append(x)
                ys.append(rate)
        edges = [i * BIN for i in range(nbins + 1)]
        ax.stairs([c / BIN for c in counts], edges, fill=True, alpha=0.35,
                  label="admitted r/s")
        for origin, (xs, ys) in rate_lines.items():
            label = "pair rate" if len(rate_lines) == 1 else f"rate {origin}"
            ax.step([*xs, edges[-1]], [*ys, ys[-1]], where="post", linewidth=1.2,
                    label=label)
        if rejected[exit_id]:
            xs = [t - t0 for t in rejected[exit_id]]
            ys = [counts[min(nbins - 1, int(x // BIN))] / BIN for x in xs]
            ax.plot(xs, ys, "x", color="red", markersize=6, label="429")
        ax.set_title(exit_id, fontsize=9, loc="left")
        ax.set_ylabel("r/s")
        ax.margins(y=0.15)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="upper right")
    if not shown:
        axes[0, 0].set_title("no admissions recorded")
    axes[-1, 0].set_xlabel("seconds since start")
    if rest:
        fig.suptitle(f"{len(shown)} busiest of {len(ranked)} exits; not shown: "
                     f"{', '.join(rest[:5])}{' ...' if len(rest) > 5 else ''}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return shown


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
        print(f"\nplot of {len(shown)} exit(s) written to {plot_to}", file=out)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plot", metavar="OUT.png", default=None,
                        help="also draw admissions, pair rates and 429s per exit to this PNG")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scrapy_exitlimit.report",
                                     description="Summarize an EXITLIMIT_TELEMETRY file.")
    parser.add_argument("telemetry", metavar="TELEMETRY", help="the .jsonl file")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args.telemetry, args.plot)


if __name__ == "__main__":
    sys.exit(main())
