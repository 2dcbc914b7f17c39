"""
Summarize py-spy's raw (collapsed) stacks: where the gateway's CPU goes.

    python -m bench.profile STACKS.txt [--top N]

Each line of the input is ``frame;frame;...;frame COUNT``, a frame being
``function (file:line)``.  Printed: the functions with the most samples on
top of the stack (self) and anywhere in it (inclusive), line numbers dropped.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

_LINE = re.compile(r":\d+\)$")
_SITE = re.compile(r"/(?:site-packages|lib/python3\.\d+)/")


def _frame(frame: str) -> str:
    frame = _LINE.sub(")", frame.strip())
    return _SITE.sub("/", frame)


def summarize(text: str, top: int = 25) -> str:
    own: Counter = Counter()
    inclusive: Counter = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        return "no samples"

    def block(title: str, counter: Counter) -> list[str]:
        lines = [f"{title} (of {total:,} samples):"]
        for frame, n in counter.most_common(top):
            lines.append(f"  {n / total * 100:5.1f} %  {frame}")
        return lines

    return "\n".join(block("self", own) + [""] + block("inclusive", inclusive))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("stacks")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    with open(args.stacks) as f:
        print(summarize(f.read(), args.top))


if __name__ == "__main__":
    main()
