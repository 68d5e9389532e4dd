"""`regen verify | check-config | plan | config-reference` (or `python -m regen ...`, in the project's venv).

`verify <manifest URI | dataset/version | dataset>`: is a published version whole and right? `check-config [PATH]`:
is the config valid (every problem one line, exit 2)? With `--probe-storage`, does its storage root take writes,
conditional ones included (plan's probe)? `plan [--conf JSON]`: what a run's conf would run, without
running it. `config-reference`: the configuration reference page, from the config models.

`verify` streams every file the manifest names (sha256 and size), reads every training record (prompt + output, mask
boundary, ids inside the vocabulary, EOS), prints a summary as JSON and exits 0, or lists every problem and exits 1. S3
is read with boto3's usual credentials (AWS_* variables, profiles; AWS_ENDPOINT_URL_S3 for a non-AWS endpoint).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from regen.cli_checks import config_problems, config_summary, plan_summary
from regen.config import ConfigError, config_path
from regen.config.reference import render
from regen.redaction import install_log_redaction
from regen.verify import manifest_uri_of, verify_version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="regen", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-config", help="validate a config file: every problem one line, exit 2")
    check.add_argument("path", nargs="?", type=Path, help="the config file (default: $REGEN_CONFIG or the project's)")
    check.add_argument(
        "--probe-storage",
        action="store_true",
        help="also probe defaults.storage_root as plan does: it takes a write, refuses a create over an existing key "
        "and a stale If-Match (S3: boto3's usual credentials)",
    )
    plan = commands.add_parser("plan", help="what a run's conf would run (datasets, sizes, endpoints), not running it")
    plan.add_argument("--conf", default="{}", help="the run's conf as JSON, as given at trigger (default: {})")
    plan.add_argument("--config", type=Path, help="the config file (default: $REGEN_CONFIG or the project's)")
    plan.add_argument("--run-id", default="plan", help="the run id a version defaults to (default: plan)")
    reference = commands.add_parser("config-reference", help="the configuration reference page, from the models")
    reference.add_argument("--output", type=Path, help="write it here (default: stdout)")
    verify = commands.add_parser("verify", help="check a published version against its manifest")
    verify.add_argument(
        "target",
        help="a manifest URI (s3://... or a path), or dataset/version with --root, or dataset for its latest version "
        "(its manifest checked against the sha256 in latest.json)",
    )
    verify.add_argument("--root", help="the storage root the version was published under (with dataset/version)")
    verify.add_argument(
        "--profile", help="the profile it was published for (default: the one profile under --root that holds it)"
    )
    verify.add_argument("--files-only", action="store_true", help="check files only, not every record")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    install_log_redaction()  # no login or key in what the CLI logs (regen.redaction)
    if args.command == "check-config":
        return _check_config(args.path or config_path(), args.probe_storage)
    if args.command == "plan":
        return _plan(args.conf, args.config or config_path(), args.run_id)
    if args.command == "config-reference":
        return _reference(args.output)
    return _verify(args)


def _verify(args: argparse.Namespace) -> int:
    try:
        uri, manifest_sha256 = manifest_uri_of(args.target, args.root, args.profile)
        result = verify_version(uri, records=not args.files_only, manifest_sha256=manifest_sha256)
    except (ValueError, OSError) as e:
        print(f"regen verify: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if not _is_s3_error(e):
            raise
        print(f"regen verify: {_s3_problem(args.target, e)}", file=sys.stderr)
        return 2
    if result.problems:
        print(f"{uri}: {len(result.problems)} problems", file=sys.stderr)
        for problem in result.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in result.summary().items() if k != "problems"}, indent=1))
    return 0


def _check_config(path: Path, probe_storage: bool = False) -> int:
    config, problems = config_problems(path)
    for problem in problems:
        print(f"regen check-config: {problem}", file=sys.stderr)
    if config is None or problems:
        return 2
    if probe_storage:
        import uuid

        from regen.layout import write_check_key
        from regen.storage import check_writable, open_storage

        try:
            storage = open_storage(config.storage_root)
            check_writable(storage, write_check_key(config.defaults.profile, uuid.uuid4().hex))
        except (PermissionError, ValueError) as e:
            print(f"regen check-config: {e}", file=sys.stderr)
            return 2
    summary = config_summary(config)
    print(f"{path}: valid; {len(summary['datasets'])} datasets, {len(summary['profiles'])} profiles")
    print(json.dumps(summary, indent=1))
    return 0


def _plan(conf: str, path: Path, run_id: str) -> int:
    config, problems = config_problems(path)
    try:
        params: Any = json.loads(conf)
    except json.JSONDecodeError as e:
        problems.append(f"--conf is not JSON: {e}")
        params = {}
    if not isinstance(params, dict):
        problems.append("--conf must be a JSON object, as a run's conf is")
    if config is None or problems:
        for problem in problems:
            print(f"regen plan: {problem}", file=sys.stderr)
        return 2
    try:
        summary = plan_summary(params, config, run_id)
    except ConfigError as e:
        print(f"regen plan: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1))
    return 0


def _reference(output: Path | None) -> int:
    page = render()
    if output is None:
        sys.stdout.write(page)
    else:
        output.write_text(page, encoding="utf-8")
    return 0


def _is_s3_error(error: Exception) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(error, (BotoCoreError, ClientError))


def _s3_problem(target: str, error: Exception) -> str:
    """What a reader of S3 got wrong, in a sentence: the endpoint, the credentials, the bucket or the key."""
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    if isinstance(error, EndpointConnectionError):
        return (
            f"cannot reach the S3 API ({error}). Is it running? `make demo-s3` stops its own S3 API when it ends "
            "(it verifies what it published before that); for another endpoint set AWS_ENDPOINT_URL_S3"
        )
    if isinstance(error, NoCredentialsError):
        return "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS profile)"
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
    if code in ("NoSuchKey", "404", "NotFound"):
        return f"{target}: no such object on S3 ({code}): check the bucket, prefix, profile and version"
    return f"{target}: S3 refused the read ({type(error).__name__}: {error})"


if __name__ == "__main__":
    sys.exit(main())
