"""Run a command and report the peak memory of its whole process tree (summed RSS, sampled).

    python tools/peak_memory.py [--interval 0.25] [--limit-gb 12] [--log FILE] -- COMMAND ...

Every ``--interval`` seconds it reads /proc for the command and all its descendants (pytest's xdist workers,
the benchmark subprocesses they start) and sums their resident set sizes. At the end it prints the peak,
when it happened, and the processes that made it up, then exits with the command's own exit status. With
``--limit-gb`` a peak above the limit is reported as such (the exit status stays the command's: the figure
is a measurement, the suite's verdict is pytest's). ``--log`` appends one line per sample (seconds, GB, the
biggest process) for finding which test file holds the memory. Linux only (it reads /proc).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process this user can see."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _rss_bytes(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _cmdline(pid: int) -> str:
    try:
        raw = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def tree_rss(root: int) -> list[tuple[int, int]]:
    """(pid, RSS bytes) of ``root`` and every descendant."""
    tree = _children()
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append((pid, _rss_bytes(pid)))
        stack.extend(tree.get(pid, []))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--limit-gb", type=float, default=None, help="say whether the peak stayed under this")
    parser.add_argument("--log", type=Path, default=None, help="append one line per sample here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: python tools/peak_memory.py -- COMMAND ...")

    start = time.monotonic()
    proc = subprocess.Popen(command)
    peak, peak_at, peak_procs = 0, 0.0, []
    log = args.log.open("a") if args.log else None
    while proc.poll() is None:
        procs = tree_rss(proc.pid)
        total = sum(rss for _, rss in procs)
        now = time.monotonic() - start
        if total > peak:
            peak, peak_at = total, now
            peak_procs = sorted(((rss, pid, _cmdline(pid)) for pid, rss in procs), reverse=True)[:4]
        if log:
            big_rss, big_pid = max((rss, pid) for pid, rss in procs)
            biggest = f"biggest {big_rss / 1e9:5.2f} GB {_cmdline(big_pid)}"
            log.write(f"{now:8.1f} s {total / 1e9:6.2f} GB  {biggest}\n")
            log.flush()
        time.sleep(args.interval)
    if log:
        log.close()

    verdict = ""
    if args.limit_gb is not None:
        verdict = f" ({'within' if peak <= args.limit_gb * 1e9 else 'OVER'} the {args.limit_gb:g} GB goal)"
    print(f"\npeak memory of `{' '.join(command)[:80]}`: {peak / 1e9:.1f} GB summed RSS{verdict}, "
          f"at {peak_at / 60:.1f} of {(time.monotonic() - start) / 60:.1f} min; its biggest processes then:")
    for rss, pid, cmd in peak_procs:
        print(f"  {rss / 1e9:5.2f} GB  pid {pid}  {cmd}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
