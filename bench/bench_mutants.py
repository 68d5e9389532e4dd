"""Test strength, measured: mutation testing of the core modules.

For each module: cosmic-ray (pinned in requirements-dev.txt) lists every mutant of the module (an operator applied at
one place); all of them are run, or a seeded random sample of --sample (300) where the module has more. Each mutant is
written into a COPY of the tree (never the checkout: tests may run there meanwhile), and the module's killing suite is
run against it in a subprocess, PYTHONPATH=<copy>/include:<copy> so the copy's modules load instead of the editable
install. A mutant is killed when the suite fails (or times out), survives when it passes.

Before the mutants, per module:
  * the suite is run on the unmutated copy (the baseline): it must pass. A test that fails there (someone's work in
    progress, a flaky test) would kill every mutant, so it is deselected and named in the report;
  * a deliberately broken module (its first line raises) must be killed: proof that the copy is what the suite loads.

Mutants inside annotations (parameter, return and variable annotations) are not run: every module here has
`from __future__ import annotations`, so an annotation is never evaluated unless a class reads its fields' (msgspec
Struct, pydantic, TypedDict, NamedTuple: those fields' annotations are run) or the module evaluates signatures
(get_type_hints, validate_call: then every signature's are run). They are counted apart as "annotation"
(equivalent by construction) and left out of the score's denominator. So is a mutant that is no Python at all
("invalid": cosmic-ray turns `{**x}` into `{+x}`), which no test needs to kill.

The killing suite (MODULES below) of a module: the fast-tier test files that import it, found by parsing the imports
of tests/ (`--print-importers` prints them), minus the parity/e2e/contract files, which the marker expression
deselects anyway; a file that imports it and is not in MODULES yet is added to its suite, last. verify_vocab is
imported by no test, only by verify, so its suite is verify's tests that reach it, and export's adds the two files
that check its splits through the pipeline (the held-out split, older releases' files), which import the pipeline
rather than export. Files are ordered fastest first so that `-x` stops a killed mutant early. Each run is

    python -m pytest -x -q -p no:randomly -p no:cacheprovider
        -m "not e2e and not parity and not crashpoints and not generated" <suite files>

with a per-mutant timeout of --timeout-factor x the baseline's wall time + 10 s (a timeout counts as killed, and is
reported apart).

Only the tests that run the mutated code, as a mutant cannot change a test that never reaches it: the baseline runs
under coverage with one context per test (pytest-cov's --cov-context=test), and a mutant runs the tests that executed
its statement (an `if`'s or a loop's header lines, not its body). A statement run at import time (a default, a
decorator, a module constant) or found in no statement runs the whole suite; one that no test runs survives without a
run ("uncovered" in the report). A mutant the selected tests let pass runs their whole files too before it counts
as a survivor: a test reading a module-scoped fixture's result is not given the lines the fixture ran. --whole-suite
turns the selection off.

    nice -n 19 .venv/bin/python bench/bench_mutants.py holdout vocab_files --report var/bench/mutants.json
    .venv/bin/python bench/bench_mutants.py --list            # the modules, their mutants and suites, nothing run

--workers N runs N mutants at once, each worker in a copy of its own (one worker a core: the fast tier's tests run
side by side as pytest-xdist runs them). --source head (the default) copies the committed tree (git archive HEAD),
--source <commit> that commit's; --source worktree copies the working tree as it is, uncommitted changes included.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKERS = "not e2e and not parity and not crashpoints and not generated"
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-m", MARKERS]

# module key -> (path in the repo, killing suite: fast-tier test files that import the module, fastest first)
MODULES: dict[str, tuple[str, list[str]]] = {
    "holdout": (
        "include/regen/holdout.py",
        ["tests/unit/test_held_out_sources.py", "tests/unit/test_training_ready.py"],
    ),
    "vocab": (
        "include/regen/vocab.py",
        ["tests/unit/stages/publish/test_vocab_sizes.py", "tests/unit/test_training_ready.py"],
    ),
    "vocab_files": (
        "include/regen/stages/publish/vocab_files.py",
        ["tests/unit/stages/publish/test_vocab_sizes.py", "tests/unit/test_training_ready.py"],
    ),
    "verify_vocab": (
        "include/regen/verify_vocab.py",
        ["tests/unit/test_verify.py", "tests/unit/test_training_ready.py"],
    ),
    "claims": (
        "include/regen/claims.py",
        ["tests/unit/test_claims.py", "tests/unit/test_nightly.py", "tests/unit/test_crash_points.py"],
    ),
    "version_inputs": (
        "include/regen/version_inputs.py",
        [
            "tests/unit/test_version_inputs.py",
            "tests/unit/stages/publish/test_latest.py",
            "tests/unit/test_verify.py",
            "tests/unit/test_nightly.py",
        ],
    ),
    "order": (
        "include/regen/stages/generate/order.py",
        [
            "tests/unit/stages/generate/test_send_order.py",
            "tests/unit/test_first_version_order.py",
            "tests/unit/test_hints.py",
        ],
    ),
    "checkpoints": (
        "include/regen/stages/generate/checkpoints.py",
        [
            "tests/unit/stages/generate/test_reopen.py",
            "tests/unit/stages/generate/test_checkpoint_outage.py",
            "tests/unit/stages/generate/test_generate.py",
            "tests/unit/stages/generate/test_generate_faults.py",
            "tests/unit/stages/generate/test_endpoint_faults.py",
            "tests/unit/test_fleet_losses.py",
        ],
    ),
    "export": (  # and the held-out split through the pipeline, where export's splits are checked whole
        "include/regen/stages/export.py",
        [
            "tests/unit/stages/export/test_export.py",
            "tests/unit/stages/publish/test_publish.py",
            "tests/unit/test_fleet_losses.py",
            "tests/unit/test_training_ready.py",
            "tests/unit/test_older_releases.py",
        ],
    ),
    "judge": (
        "include/regen/judge.py",
        [
            "tests/unit/test_tool_call_grammars.py",
            "tests/unit/stages/validate/test_validate.py",
            "tests/unit/stages/export/test_export.py",
        ],
    ),
    "verify": (
        "include/regen/verify.py",
        [
            "tests/unit/test_verify.py",
            "tests/unit/test_claims.py",
            "tests/unit/stages/publish/test_publish_race.py",
            "tests/unit/test_s3_faults.py",
            "tests/unit/test_training_ready.py",
            "tests/unit/test_nightly.py",
        ],
    ),
}

# Classes that read their fields' annotations when they are made (msgspec, pydantic; NamedTuple and TypedDict only
# compile theirs, but are treated alike), and calls that evaluate a function's.
RUNTIME_CLASSES = {"Struct", "BaseModel", "TypedDict", "NamedTuple"}
EVALUATES_SIGNATURES = re.compile(r"\b(get_type_hints|validate_call)\b")


def importers(tests: Path) -> dict[str, list[str]]:
    """Test files importing each module (the mapping SUITES was built from)."""
    dotted = {
        key: path.removeprefix("include/").removesuffix(".py").replace("/", ".") for key, (path, _) in MODULES.items()
    }
    found: dict[str, list[str]] = {key: [] for key in MODULES}
    for file in sorted(tests.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        for key, module in dotted.items():
            if module in names:
                found[key].append(str(file.relative_to(tests.parent)))
    return found


def suite_of(key: str, tree: Path = ROOT) -> list[str]:
    """The module's killing suite in `tree` (the copy a run mutates: its tests, not the checkout's): MODULES' files
    (fastest first), then every other fast-tier file there that imports the module, so that a test file written after
    MODULES still counts (a mutant only it kills would survive)."""
    listed = MODULES[key][1]
    slow = ("tests/e2e/", "tests/parity/", "tests/contract/")
    found = importers(tree / "tests")[key]
    return listed + [f for f in found if f not in listed and not f.startswith(slow) and not f.endswith("conftest.py")]


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions of the annotations that are never evaluated: under `from __future__ import
    annotations`, every one but the fields of a class that reads them (RUNTIME_CLASSES) and, where the module
    evaluates signatures (EVALUATES_SIGNATURES), those of functions."""
    if "from __future__ import annotations" not in source:
        return []
    tree = ast.parse(source)
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    read_fields = {
        id(statement)
        for node in classes
        if {ast.unparse(base).split(".")[-1] for base in node.bases} & RUNTIME_CLASSES
        for statement in node.body
    }
    signatures_read = bool(EVALUATES_SIGNATURES.search(source))
    spans = []
    for node in ast.walk(tree):
        found: list[ast.expr | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not signatures_read:
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            found = [argument.annotation for argument in every if argument is not None]
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign) and id(node) not in read_fields:
            found = [node.annotation]
        for annotation in found:
            if annotation is not None and annotation.end_lineno is not None and annotation.end_col_offset is not None:
                spans.append(
                    ((annotation.lineno, annotation.col_offset), (annotation.end_lineno, annotation.end_col_offset))
                )
    return spans


def in_annotation(spans, start: tuple[int, int], end: tuple[int, int]) -> bool:
    return any(low <= tuple(start) and tuple(end) <= high for low, high in spans)


def mutants(path: Path) -> list:
    from cosmic_ray.commands.init import _all_work_items

    return [item.mutations[0] for item in _all_work_items([path], {})]


def copy_tree(source: str, into: Path) -> str:
    """The tree to mutate; returns what it is (a commit, or the working tree)."""
    if source != "worktree":
        revision = "HEAD" if source == "head" else source
        commit = subprocess.run(["git", "rev-parse", revision], cwd=ROOT, capture_output=True, text=True, check=True)
        archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
        return commit.stdout.strip()
    excluded = [".venv", ".venv-sglang", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis"]
    excludes = [f"--exclude={name}" for name in [*excluded, "__pycache__"]]
    subprocess.run(["rsync", "-a", *excludes, f"{ROOT}/", f"{into}/"], check=True)
    return "working tree"


def run_suite(copy: Path, suite: list[str], extra: list[str], timeout: float) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'timeout', seconds, output) of one run of the suite in the copy."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(copy),
        "PYTHONPATH": f"{copy}/include:{copy}",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for name in ("LANG", "LC_ALL", "TMPDIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, *PYTEST, *extra, *suite],
        cwd=copy,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.communicate()
        return "timeout", time.monotonic() - started, ""
    text = output.decode("utf-8", "replace")
    return ("passed" if process.returncode == 0 else "failed"), time.monotonic() - started, text


def failed_tests(output: str) -> list[str]:
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)


def coverage_rc(copy: Path, relative: str) -> Path:
    rc = copy / ".bench-mutants-coveragerc"
    rc.write_text(f"[run]\ninclude = {copy / relative}\ndata_file = {copy / '.bench-mutants-coverage'}\n")
    return rc


def tests_by_line(copy: Path, relative: str) -> dict[int, set[str]]:
    """Line -> the test node ids that executed it in the baseline ("" for import time)."""
    from coverage import CoverageData

    data = CoverageData(basename=str(copy / ".bench-mutants-coverage"))
    data.read()
    filename = next((name for name in data.measured_files() if name.endswith(relative)), None)
    if filename is None:
        return {}
    return {
        line: {context.rsplit("|", 1)[0] for context in contexts}
        for line, contexts in data.contexts_by_lineno(filename).items()
    }


def statement_lines(tree: ast.AST, position: tuple[int, int]) -> range | None:
    """The lines of the innermost statement holding position; for a compound statement, its header only."""
    found: ast.stmt | None = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or node.end_lineno is None or node.end_col_offset is None:
            continue
        holds = (node.lineno, node.col_offset) <= position < (node.end_lineno, node.end_col_offset)
        if holds and (found is None or (node.lineno, node.col_offset) >= (found.lineno, found.col_offset)):
            found = node
    if found is None or found.end_lineno is None:
        return None
    body = getattr(found, "body", None)
    last = body[0].lineno - 1 if isinstance(body, list) and body and body[0].lineno > found.lineno else found.end_lineno
    return range(found.lineno, max(last, found.lineno) + 1)


def covering(by_line: dict[int, set[str]], lines: range | None) -> set[str] | None:
    """The tests a mutant on these lines needs; None for the whole suite, an empty set when no test runs them."""
    if lines is None:
        return None
    tests: set[str] = set()
    for line in lines:
        tests |= by_line.get(line, set())
    return None if "" in tests else tests


def durations(output: str) -> dict[str, float]:
    """Seconds each test took in a run with --durations=0 (setup, call and teardown summed)."""
    seconds: dict[str, float] = {}
    for taken, test in re.findall(r"^([\d.]+)s (?:setup|call|teardown)\s+(\S.*)$", output, re.MULTILINE):
        seconds[test] = seconds.get(test, 0.0) + float(taken)
    return seconds


def fastest_first(tests: set[str], seconds: dict[str, float]) -> list[str]:
    """The fastest test first, so that -x stops a killed mutant early."""
    return sorted(tests, key=lambda test: (seconds.get(test, float("inf")), test))


def whole_files(tests: set[str], seconds: dict[str, float]) -> list[str]:
    """The files of the selected tests, fastest first. A test that reads a module-scoped fixture's result runs none of
    the module's code itself: coverage gives those lines to the test that set the fixture up, so the selection can
    leave out the test that would kill the mutant. A mutant the selection lets pass runs these before it survives."""
    took: dict[str, float] = {}
    for test in tests:
        took.setdefault(test.split("::")[0], 0.0)
    for test, taken in seconds.items():
        if (file := test.split("::")[0]) in took:
            took[file] += taken
    return sorted(took, key=lambda file: (took[file], file))


def describe(spec, source_lines: list[str], mutated: str | None) -> str:
    """The mutated line, before -> after."""
    line = spec.start_pos[0]
    before = source_lines[line - 1].strip()
    after = mutated.splitlines()[line - 1].strip() if mutated else "?"
    return f"{before}  ->  {after}"


def run_module(key: str, args, copies: list[Path], report: dict, save) -> dict:
    """The module's baseline and broken-module check in the first copy, then its mutants, one a worker at a time,
    each worker writing its mutant into a copy of its own."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    copy = copies[0]
    relative, suite = MODULES[key][0], suite_of(key, copy)
    path = copy / relative
    source = path.read_text()
    lines = source.splitlines()
    every = mutants(path)
    chosen = list(range(len(every)))
    if len(every) > args.sample:
        chosen = sorted(random.Random(f"{args.seed}:{key}").sample(chosen, args.sample))
    spans = annotation_spans(source)
    result = {
        "module": relative,
        "suite": suite,
        "mutants": len(every),
        "sampled": len(chosen),
        "seed": args.seed if len(every) > args.sample else None,
        "operators": dict(Counter(every[index].operator_name.split("/")[1].split("_")[0] for index in chosen)),
        "deselected": [],
        "results": [],
    }
    report["modules"][key] = result

    # the baseline: the unmutated suite passes (failing tests deselected and named)
    measure = [] if args.whole_suite else ["--cov", f"--cov-config={coverage_rc(copy, relative)}", "--cov-context=test"]
    measure += ["--cov-report=", "--durations=0", "--durations-min=0"] if measure else []
    for _ in range(6):  # -x stops at the first failure: deselect it and run again, a few times at most
        extra = [f"--deselect={test}" for test in result["deselected"]]
        status, baseline, output = run_suite(copy, suite, extra + measure, args.max_baseline)
        broken = [test for test in failed_tests(output) if test not in result["deselected"]]
        if status == "passed" or not broken:
            break
        result["deselected"] += broken
    if status != "passed":
        result["error"] = f"baseline {status} (deselected {result['deselected']}):\n{output[-3000:]}"
        save()
        return result
    deselect = [f"--deselect={test}" for test in result["deselected"]]
    by_line = {} if args.whole_suite else tests_by_line(copy, relative)
    took = durations(output)
    if not args.whole_suite and not by_line:
        result["error"] = f"coverage measured nothing of {relative}: the suite does not load the copy"
        save()
        return result
    tree = ast.parse(source)
    result["baseline_seconds"] = round(baseline, 1)
    timeout = args.timeout_factor * baseline + 10
    print(
        f"{key}: {len(every)} mutants, {len(chosen)} run; baseline {baseline:.1f}s, timeout {timeout:.0f}s", flush=True
    )

    # the copy is what the suite loads: a module that raises on import must be killed
    path.write_text('raise RuntimeError("bench_mutants: the copy is loaded")\n' + source)
    try:
        status, _, _ = run_suite(copy, suite, deselect, timeout)
    finally:
        path.write_text(source)
    if status == "passed":
        result["error"] = "a module that raises on import survived: the suite does not load the copy"
        save()
        return result

    kept = [  # --recheck: the survivors run again, on this tree (tests added since may kill them)
        entry
        for entry in args.previous.get(key, {}).get("results", [])
        if not (args.recheck and entry["outcome"] == "survived")
    ]
    done = {(entry["operator"], entry["occurrence"]) for entry in kept}
    result["results"] = kept
    free, lock = list(copies), threading.Lock()

    def run_mutant(count: int, index: int) -> None:
        spec = every[index]
        operator = get_operator(spec.operator_name)(**(spec.operator_args or {}))
        mutated = mutate_code(source, operator, spec.occurrence)
        entry = {
            "operator": spec.operator_name,
            "occurrence": spec.occurrence,
            "line": spec.start_pos[0],
            "mutation": describe(spec, lines, mutated),
        }
        if mutated is None:
            entry["outcome"] = "no mutation"
        elif not compiles(mutated, relative):
            entry["outcome"] = "invalid"  # cosmic-ray wrote no Python (`{+x}` from `{**x}`): not a program to kill
        elif in_annotation(spans, spec.start_pos, spec.end_pos):
            entry["outcome"] = "annotation"
        elif (tests := None if args.whole_suite else covering(by_line, statement_lines(tree, spec.start_pos))) == set():
            entry["outcome"] = "survived"
            entry["uncovered"] = True
        else:
            entry["tests"] = "suite" if tests is None else len(tests)
            selected = fastest_first(tests, took) if tests else suite
            with lock:
                mine = free.pop()
            (mine / relative).write_text(mutated)
            try:
                status, seconds, output = run_suite(mine, selected, deselect, timeout)
                if status == "passed" and tests:  # a survivor of the selection: see whole_files
                    entry["files"] = len(files := whole_files(tests, took))
                    status, more, output = run_suite(mine, files, deselect, timeout)
                    seconds += more
            finally:
                (mine / relative).write_text(source)
                with lock:
                    free.append(mine)
            entry["seconds"] = round(seconds, 1)
            entry["outcome"] = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[status]
            if status == "failed":
                entry["killed_by"] = (failed_tests(output) or ["(collection or import)"])[0]
        with lock:
            result["results"].append(entry)
            if entry["outcome"] == "survived":
                print(f"  [{count}/{len(chosen)}] SURVIVED {relative}:{entry['line']}  {entry['mutation']}", flush=True)
            elif count % 10 == 0:
                print(f"  [{count}/{len(chosen)}] {Counter(e['outcome'] for e in result['results'])}", flush=True)
            save()

    todo = [(n, index) for n, index in enumerate(chosen, 1) if _key(every[index]) not in done and n > args.after]
    with ThreadPoolExecutor(len(copies)) as pool:
        list(pool.map(lambda item: run_mutant(*item), todo))  # raises what a worker raised
    result["results"].sort(key=lambda entry: (entry["line"], entry["operator"], entry["occurrence"]))
    return result


def compiles(source: str, path: str) -> bool:
    try:
        compile(source, path, "exec")
    except SyntaxError:
        return False
    return True


def _key(spec) -> tuple[str, int]:
    return spec.operator_name, spec.occurrence


def summary(result: dict) -> dict:
    outcomes = Counter(entry["outcome"] for entry in result["results"])
    ran = outcomes["killed"] + outcomes["timeout"] + outcomes["survived"]
    return {
        "mutants": result["mutants"],
        "sampled": result["sampled"],
        "done": len(result["results"]),
        "killed": outcomes["killed"],
        "timeouts": outcomes["timeout"],
        "survived": outcomes["survived"],
        "annotation": outcomes["annotation"],
        "invalid": outcomes["invalid"],
        "score": round(100 * (outcomes["killed"] + outcomes["timeout"]) / ran, 1) if ran else None,
    }


def print_summary(report: dict) -> None:
    print(
        f"\n{'module':<16}{'mutants':>8}{'sampled':>8}{'done':>6}{'killed':>7}{'t/o':>5}{'surv':>6}{'annot':>6}{'score':>7}"
    )
    for key, result in report["modules"].items():
        if "error" in result:
            print(f"{key:<16} ERROR: {result['error'][:200]}")
            continue
        row = summary(result)
        score = "-" if row["score"] is None else f"{row['score']}%"
        print(
            f"{key:<16}{row['mutants']:>8}{row['sampled']:>8}{row['done']:>6}{row['killed']:>7}{row['timeouts']:>5}"
            f"{row['survived']:>6}{row['annotation']:>6}{score:>7}"
        )
    for key, result in report["modules"].items():
        survivors = [entry for entry in result["results"] if entry["outcome"] == "survived"]
        if survivors:
            print(f"\nsurvivors of {key}:")
            for entry in survivors:
                print(f"  {result['module']}:{entry['line']}  {entry['operator'].split('/')[1]}  {entry['mutation']}")


def markdown(report: dict) -> str:
    """The report as the table docs/benchmarks.md takes, survivors listed under it."""
    out = [
        "| module | mutants | run | killed | timeouts | survived | annotation (not run) | score |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, result in report["modules"].items():
        if "error" in result:
            out.append(f"| {key} | {result['mutants']} | error: {result['error'].splitlines()[0]} | | | | | |")
            continue
        row = summary(result)
        sampled = f"{row['sampled']} (seeded sample)" if result.get("seed") is not None else f"{row['sampled']} (all)"
        if row["done"] < row["sampled"]:
            sampled += f", {row['done']} done"
        score = "-" if row["score"] is None else f"**{row['score']}%**"
        out.append(
            f"| {key} | {row['mutants']} | {sampled} | {row['killed']} | {row['timeouts']} | {row['survived']} "
            f"| {row['annotation']} | {score} |"
        )
    for key, result in report["modules"].items():
        survivors = [entry for entry in result["results"] if entry["outcome"] == "survived"]
        if survivors:
            out.append(f"\nSurvivors of {key} ({result['module']}):\n")
            out += [f"- {result['module']}:{entry['line']} `{entry['mutation']}`" for entry in survivors]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help=f"of {', '.join(MODULES)} (default: all, in that order)")
    parser.add_argument("--sample", type=int, default=300, help="mutants run per module when it has more (300)")
    parser.add_argument("--seed", type=int, default=54, help="of the sample (54)")
    parser.add_argument("--timeout-factor", type=float, default=3.0, help="per-mutant timeout: x baseline + 10 s")
    parser.add_argument("--max-baseline", type=float, default=900.0, help="seconds the unmutated suite may take")
    parser.add_argument(
        "--source", default="head", help="what is copied and mutated: head (default), worktree, or a commit"
    )
    parser.add_argument(
        "--after", type=int, default=0, help="run only the mutants after the first N (a run cut short, its report lost)"
    )
    parser.add_argument("--whole-suite", action="store_true", help="every mutant runs the whole suite (no coverage)")
    parser.add_argument("--workers", type=int, default=1, help="mutants run at once, each in a copy of its own")
    parser.add_argument("--report", type=Path, help="JSON report, rewritten after every mutant")
    parser.add_argument("--resume", action="store_true", help="skip the mutants the --report already has")
    parser.add_argument(
        "--recheck", action="store_true", help="with --resume: run the report's survivors again, the rest kept"
    )
    parser.add_argument("--list", action="store_true", help="the modules, their mutant counts and suites; no run")
    parser.add_argument("--markdown", type=Path, help="print this report as a markdown table; no run")
    parser.add_argument("--print-importers", action="store_true", help="the test files importing each module")
    args = parser.parse_args()
    keys = args.modules or list(MODULES)
    unknown = [key for key in keys if key not in MODULES]
    if unknown:
        parser.error(f"unknown modules {unknown}; known: {list(MODULES)}")
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    if args.print_importers:
        for key, files in importers(ROOT / "tests").items():
            print(f"{key}: {' '.join(files) or '(none)'}")
        return
    if args.list:
        for key in keys:
            relative, suite = MODULES[key][0], suite_of(key)
            print(f"{key:<16}{len(mutants(ROOT / relative)):>6} mutants  {relative}  suite: {' '.join(suite)}")
        return

    args.previous = {}
    if args.resume and args.report and args.report.exists():
        args.previous = json.loads(args.report.read_text()).get("modules", {})
    report = {
        "tool": "cosmic-ray 8.7.0",
        "command": " ".join(sys.argv),
        "pytest": " ".join(["python", *PYTEST, "<suite>"]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "modules": {},
    }

    def save() -> None:
        if args.report:
            args.report.write_text(json.dumps(report, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="bench-mutants-") as directory:
        copies = [Path(directory) / f"worker-{n}" for n in range(max(1, args.workers))]
        copies[0].mkdir()
        report["tree"] = copy_tree(args.source, copies[0])
        for copy in copies[1:]:  # the first copy's files: every worker mutates the same tree, whatever moves meanwhile
            shutil.copytree(copies[0], copy, symlinks=True)
        report["workers"] = len(copies)
        for key in keys:
            run_module(key, args, copies, report, save)
            save()
    print_summary(report)
    if args.report:
        print(f"\nreport: {args.report}")


if __name__ == "__main__":
    main()
