"""``python -m sim``: run the simulated fleet for a range of seeds.

    python -m sim --seeds 500 --first-seed 1      # 500 seeds, 1..500
    python -m sim --seeds 1 --first-seed 4711 -v  # one seed, its faults and trail

Every run is decided by its seed alone (and the commit): a violation printed with its
seed is replayed by running that seed again. The last line is JSON: ``seeds``,
``violations``, ``simulated_seconds``, ``cpu_seconds``, and ``trace_hash`` when one
seed ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from sim.runs import SeedReport, run_one

REGRESSIONS = Path(__file__).with_name("regressions.txt")
"""Seeds that once found a fault: every CI run includes them."""
OPEN_FINDINGS = Path(__file__).with_name("open_findings.txt")
"""Seeds that fail on the current code: findings not fixed yet."""


def seeds_in(path: Path) -> list[int]:
    seeds = []
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            seeds.append(int(text))
    return seeds


def regression_seeds() -> list[int]:
    return seeds_in(REGRESSIONS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (default 100)")
    parser.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--regressions", action="store_true", help="also run sim/regressions.txt")
    parser.add_argument(
        "--skip-open", action="store_true", help="leave out sim/open_findings.txt's seeds"
    )
    parser.add_argument("--duration", type=float, default=180.0, help="simulated seconds per seed")
    parser.add_argument("--faults", type=int, default=24, help="faults per seed (default 24)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every seed's run")
    parser.add_argument(
        "--extra-faults",
        action="store_true",
        help="also draw the faults added since the draws were fixed (damaged sessions,"
        " feeds restarting their numbering, workers slow but alive)",
    )
    args = parser.parse_args(argv)
    if args.extra_faults:
        os.environ["SIM_EXTRA_FAULTS"] = "1"  # read by each seed's schedule
    if os.environ.get("PYTHONHASHSEED") != "0":
        # The order of a set of strings follows the hash seed: fix it, or a seed
        # would not decide its run.
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "sim", *sys.argv[1:]])
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if args.regressions:
        seeds += [s for s in regression_seeds() if s not in seeds]
    if args.skip_open:
        seeds = [s for s in seeds if s not in seeds_in(OPEN_FINDINGS)]
    work = [(seed, args.duration, args.faults) for seed in seeds]
    started = time.monotonic()
    results: list[SeedReport] = []
    if args.jobs > 1 and len(work) > 1:
        # Fresh processes for every 25 seeds each: a process that ran hundreds of
        # seeds had grown by about 8 MB a seed (something of each run outlives it),
        # which a soak of any length must not. (Not max_tasks_per_child: its pools
        # hang on Python 3.11.)
        step = 25 * args.jobs
        for start in range(0, len(work), step):
            with ProcessPoolExecutor(args.jobs) as pool:
                for result in pool.map(run_one, work[start : start + step], chunksize=1):
                    results.append(_report(result, args.verbose))
    else:
        for item in work:
            results.append(_report(run_one(item), args.verbose))
    violations = sum(len(r.violations) for r in results)
    simulated = sum(r.simulated_seconds for r in results)
    cpu = sum(r.cpu_seconds for r in results)
    summary: dict[str, object] = {
        "seeds": len(results),
        "violations": violations,
        "failing_seeds": [r.seed for r in results if r.violations],
        "simulated_seconds": round(simulated, 1),
        "cpu_seconds": round(cpu, 1),
        "wall_seconds": round(time.monotonic() - started, 1),
        "simulated_hours_per_cpu_minute": round(simulated / 3600 / (cpu / 60), 2) if cpu else None,
        "deliveries": sum(r.deliveries for r in results),
        "zombie_overlaps": sum(r.zombie_overlaps for r in results),
    }
    if len(results) == 1:
        summary["trace_hash"] = results[0].trace_hash
    print(json.dumps(summary))
    return 1 if violations else 0


def _report(result: SeedReport, verbose: bool) -> SeedReport:
    for text in result.violations:
        print(text, flush=True)
    if verbose:
        print(
            f"seed {result.seed}: {result.shape}, {result.deliveries} deliveries,"
            f" {len(result.violations)} violations, {result.cpu_seconds:.2f} s CPU,"
            f" trace {result.trace_hash}",
            flush=True,
        )
        faults = [name for name in result.faults if name != "start"]
        print(f"  faults: {', '.join(faults)}", flush=True)
    return result


if __name__ == "__main__":
    sys.exit(main())
