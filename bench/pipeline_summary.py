"""Groups the compute pipelines a run compiled, from the stderr lines VERL_LOG_PIPELINES=1 prints.

    python3 bench/pipeline_summary.py RUN.log [RUN2.log ...]

Per log: how many pipelines and the milliseconds spent creating them (a compile blocks the host
thread), then the groups of shader keys that differ only in numbers, costliest first (a group that
keeps growing over the steps is a key that follows a changing size), with when each group first and
last compiled and, for the large or costly groups, their slowest keys.
"""
import collections
import re
import sys

LINE = re.compile(r"pipeline (\d+) at ([\d.]+) s \((\d+) ms\): (\S+)")


def main(paths):
    for path in paths:
        groups = collections.defaultdict(list)
        with open(path, errors="replace") as f:
            for line in f:
                m = LINE.search(line)
                if m:
                    key = m.group(4)
                    groups[re.sub(r"\d+", "#", key)[:60]].append((float(m.group(2)), key, int(m.group(3))))
        total = sum(ms for v in groups.values() for _, _, ms in v)
        print(path, sum(len(v) for v in groups.values()), "pipelines,", total, "ms compiling")
        for name, seen in sorted(groups.items(), key=lambda g: -sum(x[2] for x in g[1]))[:25]:
            ms = sum(x[2] for x in seen)
            print(f"  {len(seen):4} x, {ms:6} ms  first {seen[0][0]:.1f} s  last {seen[-1][0]:.1f} s  {name}")
            for _, key, one in sorted(seen, key=lambda x: -x[2])[:3 if len(seen) >= 4 or ms > 1000 else 0]:
                print(f"          {one:5} ms  {key[:240]}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
