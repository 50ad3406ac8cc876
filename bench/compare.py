#!/usr/bin/env python
"""Side by side: the throughput tables two code versions printed in one session of
``bench/side-by-side.sh``, round by round.

Reads the ``run / rows deleted / seconds / rows/s / vs loop`` table that every version
of ``bench/pipeline.py`` prints (the columns and the 38-character label have been the
same since before the group batches), so an old commit measured with its own benchmark
and the committed code measured with today's line up. Usage::

    python bench/compare.py --label 92d6f66 base-1.txt base-2.txt --label HEAD head-1.txt head-2.txt

Per run label: each version's fastest seconds, every sample, and the median of the
per-round ratio to the loop of the same invocation (what the issue's tables show); the
last column is the newer version's fastest against the older one's.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROW = re.compile(r"^(?P<label>\S.{37}) +(?P<rows>[\d,]+) +(?P<seconds>[\d.]+) +[\d,]+ +(?P<ratio>[\d.]+x|-)")


@dataclass
class Version:
    name: str
    samples: dict[str, list[float]] = field(default_factory=dict)  # label -> seconds per round
    ratios: dict[str, list[float]] = field(default_factory=dict)  # label -> vs loop per round
    rows: dict[str, int] = field(default_factory=dict)


def parse(text: str) -> dict[str, tuple[int, float, float | None]]:
    """label -> (rows deleted, seconds, vs loop) of the first throughput table in ``text``."""
    out: dict[str, tuple[int, float, float | None]] = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m and not line.startswith("run "):
            ratio = m["ratio"]
            label = m["label"].rstrip()
            if label not in out:  # the first table: later ones (RSS passes) repeat labels
                out[label] = (
                    int(m["rows"].replace(",", "")),
                    float(m["seconds"]),
                    float(ratio[:-1]) if ratio != "-" else None,
                )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("items", nargs="+", help="--label NAME followed by that version's output files")
    raw = sys.argv[1:] if argv is None else argv
    versions: list[Version] = []
    files: list[tuple[Version, Path]] = []
    i = 0
    while i < len(raw):
        if raw[i] == "--label":
            versions.append(Version(raw[i + 1]))
            i += 2
            continue
        if not versions:
            parser.error("start with --label NAME")
        files.append((versions[-1], Path(raw[i])))
        i += 1
    for version, path in files:
        for label, (rows, seconds, ratio) in parse(path.read_text(errors="replace")).items():
            version.samples.setdefault(label, []).append(seconds)
            version.rows[label] = rows
            if ratio is not None:
                version.ratios.setdefault(label, []).append(ratio)
    labels: list[str] = []
    for version in versions:
        labels += [label for label in version.samples if label not in labels]
    head = f"{'run':<38}" + "".join(f" {v.name + ' s':>14} {'vs loop':>8}" for v in versions)
    if len(versions) == 2:
        head += f" {'speed-up':>16}"
    print(head)
    print("-" * len(head))
    for label in labels:
        line = f"{label:<38}"
        fastest: list[float | None] = []
        for v in versions:
            s = v.samples.get(label)
            r = v.ratios.get(label)
            fastest.append(min(s) if s else None)
            line += f" {min(s) if s else float('nan'):>14.2f} {f'{statistics.median(r):.2f}x' if r else '-':>8}"
        if len(versions) == 2 and all(fastest):
            line += f" {fastest[0] / fastest[1]:>15.2f}x"  # type: ignore[operator]
        print(line)
    print(
        "\n(seconds: fastest round; vs loop: median over rounds of loop seconds / run seconds in the same invocation;"
    )
    print(" speed-up: older fastest / newer fastest, > 1 means the newer code is faster)")
    for v in versions:
        for label, s in v.samples.items():
            print(f"  {v.name}: {label.strip()}: {'/'.join(f'{x:.2f}' for x in s)} s; rows {v.rows[label]:,}")
    rows = {(v.name, label): n for v in versions for label, n in v.rows.items()}
    mismatched = {label for label in labels if len({rows.get((v.name, label)) for v in versions} - {None}) > 1}
    if mismatched:
        print(f"ROWS DIFFER between versions for: {', '.join(sorted(mismatched))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
