"""``python -m sim.recall``: put each break of :mod:`sim.breaks` into a copy of the code
and run seeds until the simulator finds it; print seeds-to-find for each.

    python -m sim.recall                      # every break, up to 200 seeds each
    python -m sim.recall --only F1 --seeds 50

A break that another rule covers (``Break.covered_by``) runs only when named with
``--only`` or with ``--covered``: no seed can find it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim.breaks import BREAKS, Break

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("worker", "wsfleet", "lambdas", "local_stack", "sim", "fleetctl", "websocket_fleet")


def apply(target: Path, fault: Break) -> None:
    for file, text, replacement, *count in fault.edits:
        path = target / file
        source = path.read_text()
        found, expected = source.count(text), (count[0] if count else 1)
        if found != expected:
            raise SystemExit(f"{fault.name}: {file} has {found} of {text!r}; update sim/breaks.py")
        path.write_text(source.replace(text, replacement))


def find(fault: Break, seeds: int, first_seed: int, jobs: int) -> dict[str, object]:
    """Run seeds on the broken copy, a batch at a time, until one finds it."""
    with (
        tempfile.TemporaryDirectory(prefix="sim-recall-") as folder,
        tempfile.TemporaryDirectory(prefix="sim-baseline-") as unbroken,
    ):
        target, baseline = Path(folder), Path(unbroken)
        for package in PACKAGES:
            # The unbroken code as it was when the break was put in: a seed is
            # compared with the same code, whatever changes in the tree meanwhile.
            for copy in (target, baseline):
                shutil.copytree(
                    ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
                )
        apply(target, fault)
        started = time.monotonic()
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(target)}
        seed = first_seed
        baseline_failures: list[int] = []
        while seed < first_seed + seeds:
            # Four seeds a process: fewer starts; the lowest failing seed still counts.
            batch = min(4 * jobs, first_seed + seeds - seed)
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "sim",
                    "--seeds",
                    str(batch),
                    "--first-seed",
                    str(seed),
                    "--jobs",
                    str(jobs),
                ],
                cwd=target,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode not in (0, 1) or not done.stdout.strip():
                raise SystemExit(f"{fault.name}: the simulator failed:\n{done.stderr}")
            summary = json.loads(done.stdout.strip().splitlines()[-1])
            for found_by in sorted(summary["failing_seeds"]):
                # Found only if the unbroken code passes that seed: a seed that fails
                # anyway is a finding of its own, not this break's.
                if not _passes(baseline, found_by):
                    baseline_failures.append(found_by)
                    continue
                lines = done.stdout.splitlines()
                first = next((x for x in lines if x.startswith(f"seed {found_by}:")), "")
                return {
                    "break": fault.name,
                    "found": True,
                    "seeds_to_find": found_by - first_seed + 1,
                    "seed": found_by,
                    "violation": first,
                    "seconds": round(time.monotonic() - started, 1),
                    "baseline_failures": baseline_failures,
                }
            seed += batch
        return {
            "break": fault.name,
            "found": False,
            "seeds_run": seeds,
            "seconds": round(time.monotonic() - started, 1),
            "baseline_failures": baseline_failures,
        }


def _passes(code: Path, seed: int) -> bool:
    """Whether the unbroken ``code`` passes ``seed``."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, "-m", "sim", "--seeds", "1", "--first-seed", str(seed), "--jobs", "1"],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return (
        bool(done.stdout.strip())
        and json.loads(done.stdout.strip().splitlines()[-1])["violations"] == 0
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim.recall", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seeds", type=int, default=200, help="seeds per break at most")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--only", action="append", help="a break's name (repeatable)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--extra-faults",
        action="store_true",
        help="also draw the faults added since the draws were fixed (python -m sim --help)",
    )
    parser.add_argument(
        "--covered", action="store_true", help="also the breaks another rule covers"
    )
    args = parser.parse_args(argv)
    if args.extra_faults:
        os.environ["SIM_EXTRA_FAULTS"] = "1"  # the seeds' processes inherit it
    chosen = [
        b
        for b in BREAKS
        if (b.name in args.only if args.only else args.covered or b.covered_by is None)
    ]
    results = []
    for fault in chosen:
        result = find(fault, args.seeds, args.first_seed, args.jobs)
        results.append(result)
        print(json.dumps(result), flush=True)
    found = sum(1 for r in results if r["found"])
    covered = [b.name for b in BREAKS if b.covered_by is not None and b not in chosen]
    print(json.dumps({"breaks": len(results), "found": found, "covered_left_out": covered}))
    return 0 if found == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
