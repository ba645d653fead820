"""Mutation testing of the safety core with mutmut; run it through scripts/mutation.sh.

Starts one DynamoDB Local for the whole run (the store tests share it through
``WSFLEET_TEST_DYNAMODB_ENDPOINT``), runs ``mutmut run`` with the configuration in
pyproject.toml (``[tool.mutmut]``), then scores each module: killed / (killed +
survived), where the mutants listed in tests/mutation_equivalents.txt count in neither.
The last line of output is one JSON object; the exit status is 1 when a module is
under its target. docs/TESTING.md explains it all.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from local_stack import services  # noqa: E402

MUTMUT = str(Path(sys.executable).parent / "mutmut")
EQUIVALENTS = REPO / "tests" / "mutation_equivalents.txt"
LOG_DIR = REPO / ".local" / "mutation"
PROGRESS = re.compile(rb"[^\r\n]* \d+/\d+ [^\r\n]*")

#: The modules scored and the share of non-equivalent mutants each must kill.
TARGETS = {
    "wsfleet/lease_rules.py": 1.0,
    "wsfleet/session_rules.py": 1.0,
    "wsfleet/checkpoint_page.py": 1.0,
    "worker/connection_state.py": 1.0,
    "wsfleet/lease_store.py": 0.9,
    "wsfleet/session_store.py": 0.9,
    "wsfleet/timing.py": 0.9,
    "worker/connection.py": 0.9,
    "worker/handler_calls.py": 0.9,
    "worker/message_pump.py": 0.9,
    "worker/upstream_link.py": 0.9,
    "worker/failing_mark.py": 0.9,
}

#: mutmut's exit codes for one mutant (mutmut.stats.status_by_exit_code), as verdicts.
KILLED_CODES = {
    1: "tests",  # a test failed
    3: "tests",  # pytest's internal error: the mutant broke a fixture or the collection
    # A test hung until its own timeout or mutmut's limit stopped it (SIGXCPU, or
    # SIGKILL one second after it).
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    -9: "timeout",
    37: "types",  # it fails `mypy --strict`, the project's own gate: it cannot ship
}
SURVIVED_CODES = {0: "survived", 5: "no tests", 33: "no tests"}


class MutationRunError(RuntimeError):
    """The run did not produce a complete, trustworthy result."""


@dataclass
class Equivalent:
    name: str
    mutated_line: str
    reason: str


@dataclass
class ModuleScore:
    killed: int = 0
    survived: int = 0
    equivalent: int = 0
    killed_by: Counter[str] = field(default_factory=Counter)
    survivors: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        tested = self.killed + self.survived
        return round(self.killed / tested, 4) if tested else 1.0


def read_equivalents(path: Path = EQUIVALENTS) -> dict[str, Equivalent]:
    """``name | mutated line | reason`` per line; ``#`` starts a comment line."""
    found: dict[str, Equivalent] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [part.strip() for part in line.split(" | ")]
        if len(parts) != 3 or not all(parts):
            raise MutationRunError(f"{path.name}:{number}: want `name | mutated line | reason`")
        name, mutated_line, reason = parts
        if name in found:
            raise MutationRunError(f"{path.name}:{number}: {name} is listed twice")
        found[name] = Equivalent(name, mutated_line, reason)
    return found


def mutated_lines(name: str) -> list[str]:
    """The lines a mutant adds, as ``mutmut show`` prints them (stripped)."""
    shown = subprocess.run(
        [MUTMUT, "show", name],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [
        line[1:].strip()
        for line in shown.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]


def load_exit_codes(module: str) -> dict[str, int | None]:
    meta = REPO / "mutants" / f"{module}.meta"
    if not meta.exists():
        raise MutationRunError(f"no results for {module}: {meta} is missing")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    return codes


def reset_survivors() -> int:
    """Mark every surviving mutant of an earlier run as not yet tested, so a ``--keep``
    run tests it again: mutmut keeps a verdict until the mutated function changes, and
    a test added since could kill it now. Kills stand (a mutant the tests killed once
    stays killed while the tests only grow)."""
    reset = 0
    for module in TARGETS:
        meta = REPO / "mutants" / f"{module}.meta"
        if not meta.exists():
            continue
        data = json.loads(meta.read_text())
        codes = data["exit_code_by_key"]
        for name, code in codes.items():
            if code in SURVIVED_CODES:
                codes[name] = None
                reset += 1
        meta.write_text(json.dumps(data, indent=4))
    return reset


def score_modules(equivalents: dict[str, Equivalent]) -> dict[str, ModuleScore]:
    """Score every module, and check the equivalent list against the results: each
    listed mutant must exist, must not have been killed (then it is not equivalent),
    and must still be the mutation the list describes (mutmut numbers mutants per
    function, so editing a function renumbers them)."""
    scores: dict[str, ModuleScore] = {}
    seen: set[str] = set()
    for module in TARGETS:
        score = scores[module] = ModuleScore()
        for name, code in sorted(load_exit_codes(module).items()):
            if code is None:
                raise MutationRunError(f"{name} was never run (run cut short?)")
            if code in KILLED_CODES:
                verdict = "killed"
            elif code in SURVIVED_CODES:
                verdict = "survived"
            else:
                raise MutationRunError(f"{name}: exit code {code} is not a verdict")
            listed = equivalents.get(name)
            if listed is not None:
                seen.add(name)
                if verdict == "killed":
                    raise MutationRunError(
                        f"{name} is listed as equivalent but was killed: remove it from the list"
                    )
                if listed.mutated_line not in mutated_lines(name):
                    raise MutationRunError(
                        f"{name} is no longer the mutation listed ({listed.mutated_line!r}):"
                        " update tests/mutation_equivalents.txt"
                    )
                score.equivalent += 1
            elif verdict == "killed":
                score.killed += 1
                score.killed_by[KILLED_CODES[code]] += 1
            else:
                score.survived += 1
                score.survivors.append(name)
    unknown = sorted(set(equivalents) - seen)
    if unknown:
        raise MutationRunError(f"listed as equivalent but no such mutant: {', '.join(unknown)}")
    return scores


def summary(scores: dict[str, ModuleScore]) -> dict[str, object]:
    killed = sum(s.killed for s in scores.values())
    survived = sum(s.survived for s in scores.values())
    return {
        "killed": killed,
        "survived": survived,
        "equivalent": sum(s.equivalent for s in scores.values()),
        "score": round(killed / (killed + survived), 4) if killed + survived else 1.0,
        "by_module": {
            module: {
                "killed": s.killed,
                "survived": s.survived,
                "equivalent": s.equivalent,
                "score": s.score,
                "target": TARGETS[module],
                "killed_by": dict(sorted(s.killed_by.items())),
            }
            for module, s in scores.items()
        },
    }


def run_mutmut(args: list[str], log_path: Path, endpoint: str) -> None:
    """``mutmut run`` with its output in ``log_path``; a progress line every minute."""
    env = os.environ | {"WSFLEET_TEST_DYNAMODB_ENDPOINT": endpoint}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [MUTMUT, "run", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert process.stdout is not None
        output = process.stdout.fileno()
        last_progress = b""
        reported_at = time.monotonic()
        while chunk := os.read(output, 65536):
            log.write(chunk)
            # mutmut redraws one status line ("⠹ 900/984  🎉 375 ...") with carriage returns.
            progress = PROGRESS.findall(chunk)
            if progress:
                last_progress = progress[-1]
            if time.monotonic() - reported_at >= 60 and last_progress:
                reported_at = time.monotonic()
                print(f"[mutation] {last_progress.decode(errors='replace').strip()}", flush=True)
        status = process.wait()
    if status != 0:
        raise MutationRunError(f"mutmut run exited with {status}; see {log_path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--keep",
        action="store_true",
        help="reuse mutants/ from an earlier run: test its survivors and changed functions again",
    )
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--score-only", action="store_true", help="score mutants/ as it is")
    options = parser.parse_args(argv)

    os.chdir(REPO)
    equivalents = read_equivalents()
    if not options.score_only:
        if options.keep:
            print(f"[mutation] testing {reset_survivors()} survivors again", flush=True)
        else:
            shutil.rmtree(REPO / "mutants", ignore_errors=True)
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        port = services.free_port()
        dynamodb = services.start_dynamodb_local(port, LOG_DIR)
        try:
            endpoint = services.endpoint_url(port)
            print(f"[mutation] mutmut run; its output: {LOG_DIR / 'mutmut.log'}", flush=True)
            run_mutmut(
                ["--max-children", str(options.max_children)], LOG_DIR / "mutmut.log", endpoint
            )
        finally:
            dynamodb.stop()
        print(f"[mutation] done in {time.monotonic() - started:.0f} s", flush=True)

    scores = score_modules(equivalents)
    missed = []
    for module, s in scores.items():
        for name in s.survivors:
            print(f"survived: {name}  (mutmut show {name})")
        if s.score < TARGETS[module]:
            missed.append(f"{module} {s.score:.1%} < {TARGETS[module]:.0%}")
    if missed:
        print("under target: " + "; ".join(missed))
    print(json.dumps(summary(scores)), flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MutationRunError as error:
        print(f"[mutation] {error}", file=sys.stderr)
        sys.exit(2)
