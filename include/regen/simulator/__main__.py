"""`python -m regen.simulator --port N`: serve the SGLang protocol on loopback over a simulated model."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from regen.chat import ChatRenderer, TokenRoles
from regen.config import find_profile
from regen.sglang.parity import PROVEN_SGLANG_VERSION
from regen.simulator.app import build_app
from regen.simulator.defects import DEFECTS, DefectModel
from regen.simulator.faults import FaultModel
from regen.simulator.model import ModelBehaviour, SimulatedModel
from regen.simulator.server import LatencyModel, SimulatorState

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m regen.simulator", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback unless told otherwise)")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--profile", default="kimi-k2.5-mini")
    parser.add_argument("--seed", type=int, default=0, help="model seed when a request sends no sampling_seed")
    parser.add_argument("--context-length", type=int, default=16384)
    parser.add_argument("--min-tokens", type=int, default=16, help="shortest reasoning or answer part, in tokens")
    parser.add_argument("--max-tokens", type=int, default=96, help="longest reasoning or answer part, in tokens")
    parser.add_argument(
        "--length-median",
        type=int,
        default=None,
        help="heavy-tailed answers: the whole answer's length (reasoning and answer) lognormal around this median, "
        "each part within --min-tokens and --max-tokens (e.g. --length-median 1000 --max-tokens 8000 for answers of "
        "up to 16,000 tokens); default: each part uniform between them",
    )
    parser.add_argument("--length-sigma", type=float, default=1.0, help="the lognormal's sigma (with --length-median)")
    parser.add_argument(
        "--length-hint",
        action="store_true",
        help="an answer's whole length is the last '[[answer N tokens]]' at its prompt's end (a benchmark's on-policy "
        "turns); a prompt with none: as without",
    )
    parser.add_argument("--tool-call-rate", type=float, default=0.5)
    parser.add_argument("--omit-think-end-rate", type=float, default=0.0)
    parser.add_argument("--prefill-us-per-token", type=float, default=0.0)
    parser.add_argument("--decode-ms-per-token", type=float, default=0.0)
    parser.add_argument("--max-running", type=int, default=256, help="running requests; the rest queue")
    parser.add_argument(
        "--enable-metrics",
        action="store_true",
        help="as SGLang's flag: each answer's meta_info also says when it entered a running slot (forward_entry_time) "
        "and how long it waited for one (queue_time)",
    )
    parser.add_argument(
        "--enable-priority-scheduling",
        action="store_true",
        help="as SGLang's flag: requests wait for a running slot by their priority (larger first), then arrival; one "
        "without a priority last",
    )
    parser.add_argument(
        "--schedule-low-priority-values-first",
        action="store_true",
        help="as SGLang's flag: with --enable-priority-scheduling, smaller priority values first",
    )
    parser.add_argument("--warmup-s", type=float, default=0.0, help="/health answers 503 this long after start")
    parser.add_argument(
        "--sglang-version",
        default=PROVEN_SGLANG_VERSION,
        help="the SGLang version /server_info reports (default: the one the pipeline is proven against); '' for none",
    )
    for name in ("tool-call-parser", "reasoning-parser"):
        parser.add_argument(
            f"--{name}", default=None, help=f"the --{name} /server_info reports (default: the profile's); '' for none"
        )
    parser.add_argument(
        "--api-key", default=None, help="as SGLang's: every path but /health*, /ready* and /metrics* needs this bearer"
    )
    faults = parser.add_argument_group("fault injection (rates per /generate call, drawn from --fault-seed)")
    for kind, what in (
        ("http-500", "HTTP 500 in SGLang's error shape"),
        ("http-503", "HTTP 503 'The request queue is full.'"),
        ("reset", "connection dropped with no response"),
        ("hang", "no answer for --hang-s"),
        ("abort", "HTTP 200 with finish_reason abort"),
        ("slow", "--slow-s added to the latency"),
    ):
        faults.add_argument(f"--{kind}-rate", type=float, default=0.0, help=what)
    faults.add_argument("--slow-s", type=float, default=2.0)
    faults.add_argument("--hang-s", type=float, default=3600.0)
    faults.add_argument(
        "--hang-prompt-rate",
        type=float,
        default=0.0,
        help="share of prompts (drawn from their ids) that hang for --hang-s on every attempt, on every server",
    )
    faults.add_argument(
        "--abort-prompt-rate",
        type=float,
        default=0.0,
        help="share of prompts (drawn from their ids) aborted on every attempt, on every server (a sick fleet)",
    )
    faults.add_argument("--fault-seed", type=int, default=0)
    _add_defect_flags(parser)
    served = parser.add_argument_group("the served model, as /model_info and /server_info report it")
    served.add_argument("--model-path", help="reported as SGLang reports --model-path (default: the served name)")
    served.add_argument("--served-model-name", help="the name clients use (default: the profile's first)")
    served.add_argument(
        "--seeds-ignored", action="store_true", help="report enable_deterministic_inference false, as SGLang's default"
    )
    parser.add_argument(
        "--record", type=Path, help="append every answer (rid, input_ids, output_ids, defect) to this JSONL"
    )
    return parser.parse_args(argv)


def _add_defect_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "output defects (rates per answer, drawn from the prompt and seed: a retry carries the same defect)"
    )
    for kind in DEFECTS:
        group.add_argument(
            kind.flag, type=float, default=None, metavar="RATE", help=f"{kind.help} (reported as {kind.reason.value})"
        )
    group.add_argument(
        "--defect-rate",
        type=float,
        default=0.0,
        metavar="RATE",
        help="shared evenly by every defect kind not given a rate of its own",
    )
    group.add_argument(
        "--text-tokenizer-mismatch",
        action="store_true",
        help="decode `text` as if with another tokenizer, on every answer (probes included)",
    )


def defect_model(args: argparse.Namespace, roles: TokenRoles | None = None) -> DefectModel:
    """`--defect-rate` is shared by the kinds these roles can carry; a kind given a rate of its own must fit them."""
    rates = {kind.name: getattr(args, f"defect_{kind.name}_rate") for kind in DEFECTS}
    return DefectModel.spread(rates, args.defect_rate, args.text_tokenizer_mismatch, roles)


def from_flags(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """A `cls` dataclass whose fields are flags of the same names (`given`: the fields that are not)."""
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in given}
    return cls(**flags, **given)


def build_state(args: argparse.Namespace) -> SimulatorState:
    profile = find_profile(args.profile)
    behaviour = from_flags(ModelBehaviour, args, defects=defect_model(args, ChatRenderer(profile).roles))
    latency = LatencyModel(
        prefill_s_per_token=args.prefill_us_per_token / 1e6,
        decode_s_per_token=args.decode_ms_per_token / 1e3,
        max_running=args.max_running,
        warmup_s=args.warmup_s,
        priority_scheduling=args.enable_priority_scheduling,
        low_priority_values_first=args.schedule_low_priority_values_first,
    )
    fault_model = from_flags(FaultModel, args)
    model = SimulatedModel(profile, behaviour)
    parsers = {
        key: getattr(profile, key) if getattr(args, key) is None else getattr(args, key) or None
        for key in ("tool_call_parser", "reasoning_parser")
    }
    state = SimulatorState(
        model,
        profile,
        latency,
        args.context_length,
        args.record,
        fault_model,
        args.fault_seed,
        args.sglang_version,
        parsers,
    )
    name = args.served_model_name or profile.served_model_names[0]
    state.served.update(model_path=args.model_path or name, served_model_name=name)
    state.served["enable_deterministic_inference"] = not args.seeds_ignored
    state.served["enable_metrics"] = args.enable_metrics
    return state


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        state = build_state(args)
    except ValueError as e:  # rates out of range, a defect the profile cannot plant: say what to fix, no traceback
        raise SystemExit(f"python -m regen.simulator: {e}") from e
    # handler_cancellation: a request whose client went away is dropped, as SGLang aborts it.
    web.run_app(
        build_app(state, args.api_key),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()
