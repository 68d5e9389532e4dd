"""The real SGLang server (PyPI sglang 0.5.23, `python -m sglang.launch_server`) on CPU, serving a tiny model the
project builds: the oracle the pipeline is tested against. By hand:

    python -m tools.real_sglang [--profile kimi-k2.5-mini|qwen3.6] [--port P] [--log var/real-sglang.log]

- The environment is the parity tests' one (requirements-sglang.txt, built by tools/sglang_env.sh into the cache,
  keyed by the lock's hash, and linked as .venv-sglang): built here if it is not there yet (minutes, once).
- The model (tools/tiny_model.py) is a one-layer Qwen3ForCausalLM over the profile's tokenizer (the Kimi-K2.5-layout
  mini tokenizer, or Qwen3.6's), whose greedy answers are in the target's format: reasoning, `</think>`, content or
  (when the prompt declares `get_weather`) a well-formed tool call, EOS. Built once into the asset cache, keyed by
  the builder's source and the tokenizer's build.
- Launched as production launches a fleet: `--model-path <a folder>` (whose name is NOT the served name)
  `--served-model-name <the profile's name>`, the profile's parsers, `--log-requests --log-requests-level 3` (every
  request's input_ids and output_ids in the log, read back by `RealServer.finished()`), plus the CPU flags of
  docs/SGLANG_API.md ("The real server on CPU") and SGLANG_USE_CPU_ENGINE=1 with the sgl_kernel stand-in of
  tools/sglang_cpu on its PYTHONPATH.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

from regen.config import find_profile
from regen.profiles import Profile
from tools.devstack import free_port

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = ROOT / "tools" / "sglang_cpu"
# On CPU the KV cache is sized from the machine's free memory: what other processes take while the model loads counts
# against --mem-fraction-static, and 0.1 failed beside a parallel test run. --max-total-tokens bounds the pool anyway.
# --sleep-on-idle: an idle scheduler otherwise polls its sockets in a loop, a core each; a test holding two servers
# idle while it starts two more took the 2-core machine from everything else running. It waits on the sockets instead
# (a request wakes it at once), and changes no answer.
CPU_FLAGS = (
    "--device cpu --attention-backend torch_native --dtype float32 --disable-cuda-graph --tp 1 "
    "--mem-fraction-static 0.4 --max-total-tokens 16384 --chunked-prefill-size 2048 --sleep-on-idle"
).split()
CONTEXT = 16384


@dataclass(frozen=True)
class ServedProfile:
    """How the tiny model is built and served for one profile: served under the profile's name, with its parsers."""

    served_name: str
    tokenizer_dir: Callable[[], Path]

    def profile(self) -> Profile:
        return find_profile(self.served_name)


def _kimi_tokenizer() -> Path:
    from regen.tokenizers.kimi_mini import ensure_mini_tokenizer

    return ensure_mini_tokenizer()


def _qwen_tokenizer() -> Path:
    from regen.tokenizers.qwen36 import ensure_qwen36_tokenizer

    return ensure_qwen36_tokenizer()


PROFILES = {
    "kimi-k2.5-mini": ServedProfile("kimi-k2.5-mini", _kimi_tokenizer),
    "qwen3.6": ServedProfile("qwen3.6", _qwen_tokenizer),
}


def sglang_python() -> Path:
    """The SGLang env's interpreter, building the env first if this checkout has none (tools/sglang_env.sh)."""
    python = ROOT / ".venv-sglang" / "bin" / "python"
    if not python.exists():
        subprocess.run(["bash", str(ROOT / "tools" / "sglang_env.sh")], check=True)
    return python


def _build_model(profile: ServedProfile, directory: Path) -> None:
    from transformers import AutoTokenizer

    from tools import tiny_model

    source = profile.tokenizer_dir()
    for file in source.iterdir():
        if file.is_file():
            shutil.copy(file, directory / file.name)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    target = profile.profile()
    start = tokenizer.encode(target.generation_suffix, add_special_tokens=False)[-1]  # the script starts after it
    tiny_model.build_model(directory, tokenizer, tiny_model.flavour(target), start, CONTEXT)


def model_dir(profile_name: str = "kimi-k2.5-mini") -> Path:
    """The tiny model's folder for a profile (built on first use). Its name is not the served name, as in most
    deployments (`--model-path /models/<something>`)."""
    from regen.tokenizers.kimi_mini import build_once, cache_root

    profile = PROFILES[profile_name]
    digest = hashlib.sha256((ROOT / "tools" / "tiny_model.py").read_bytes())
    digest.update(Path(__file__).read_bytes())
    digest.update(profile.tokenizer_dir().name.encode())
    digest.update(profile.profile().model_dump_json().encode())  # the scripts are written in its markup
    target = cache_root() / f"tiny-qwen3-{profile_name}-{digest.hexdigest()[:12]}"
    return build_once(target, "model.safetensors", lambda staging: _build_model(profile, staging))


def server_command(
    python: Path, model: Path, port: int, profile: ServedProfile, extra: tuple[str, ...] = ()
) -> list[str]:
    parsers = profile.profile()
    return [
        str(python), "-m", "sglang.launch_server",
        "--model-path", str(model),
        "--served-model-name", profile.served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--tool-call-parser", str(parsers.tool_call_parser), "--reasoning-parser", str(parsers.reasoning_parser),
        "--log-requests", "--log-requests-level", "3",
        "--enable-metrics",  # as docs/operations.md launches it: answers say how long they queued
        "--context-length", str(CONTEXT),
        *CPU_FLAGS, *extra,
    ]  # fmt: skip


READY = "The server is fired up and ready to roll!"  # SGLang's line once its warm-up request has finished
FINISH = re.compile(r"Finish: obj=GenerateReqInput\((?P<obj>.*)\), out=(?P<out>\{.*\})\s*$")
RID = re.compile(r"\brid='(?P<rid>[^']*)'")
INPUT_IDS = re.compile(r"\binput_ids=(?P<ids>\[[-0-9, ]*\]|None)")


def parse_finished(line: str) -> dict[str, Any] | None:
    """One "Finish:" line of a server's request log as {rid, input_ids, output_ids, text, meta_info}; None for any
    other line. Read with the standard library only, independently of the pipeline's client."""
    match = FINISH.search(line)
    if match is None:
        return None
    obj = match["obj"]
    rid, ids = RID.search(obj), INPUT_IDS.search(obj)
    out = ast.literal_eval(match["out"])
    return {
        "rid": rid["rid"] if rid else None,
        "input_ids": ast.literal_eval(ids["ids"]) if ids else None,
        "output_ids": out.get("output_ids"),
        "text": out.get("text"),
        "meta_info": out.get("meta_info", {}),
    }


@dataclass
class RealServer:
    """A running real SGLang server. `url`; `served_name`; `model` (its --model-path folder); `log` (its request
    log); `finished()` parses the log's requests; `stop()` (SIGTERM then SIGKILL), `kill()` (SIGKILL: a crash)."""

    url: str
    served_name: str
    model: Path
    log: Path
    process: subprocess.Popen[bytes]

    def finished(self, include_own: bool = False) -> list[dict[str, Any]]:
        """Every request the server finished, in log order. Its own requests are left out unless asked: its warm-up
        (before it logs READY) and its /health_generate probes (rid HEALTH_CHECK_...)."""
        lines = self.log.read_text(errors="replace").splitlines()
        ready = next((i for i, line in enumerate(lines) if READY in line), len(lines))
        records = [(i, r) for i, line in enumerate(lines) if (r := parse_finished(line))]
        return [r for i, r in records if include_own or (i > ready and not str(r["rid"]).startswith("HEALTH_CHECK"))]

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
        with contextlib.suppress(ProcessLookupError):  # its scheduler and detokenizer children, if any outlived it
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> RealServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {
        **env,
        "SGLANG_USE_CPU_ENGINE": "1",  # SGLang's own switch to its CPU path (srt/utils/common.py, is_cpu)
        "PYTHONPATH": str(STAND_IN),
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def launch_real_server(
    log: Path,
    profile_name: str = "kimi-k2.5-mini",
    port: int | None = None,
    extra_args: tuple[str, ...] = (),
    model: Path | None = None,
) -> RealServer:
    """A real server's process, started (not yet ready: see start_real_servers)."""
    profile = PROFILES[profile_name]
    model = model or model_dir(profile_name)
    port = port or free_port()  # a server takes half a minute to bind it: out of the ephemeral range
    argv = server_command(sglang_python(), model, port, profile, extra_args)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, env=server_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=log.parent
        )
    return RealServer(f"http://127.0.0.1:{port}", profile.served_name, model, log, process)


def start_real_servers(
    logs: list[Path],
    profile_name: str = "kimi-k2.5-mini",
    extra_args: tuple[str, ...] = (),
    model: Path | None = None,
    ready_timeout_s: float = 300.0,
    port: int | None = None,
    each_args: Sequence[tuple[str, ...]] = (),
) -> list[RealServer]:
    """One server per log, started together (their start-ups overlap), returned once all are ready: once each one's
    /health_generate answers 200 (its own generation probe passed). `model`: another model folder (e.g. one with a
    smaller vocabulary); `extra_args`: more server flags; `each_args`: more flags for each server, by position."""
    servers: list[RealServer] = []
    try:
        for i, log in enumerate(logs):
            own = each_args[i] if i < len(each_args) else ()
            servers.append(launch_real_server(log, profile_name, port, (*extra_args, *own), model))
        for server in servers:
            _wait_ready(server, ready_timeout_s)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def _wait_ready(server: RealServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = server.log.read_text(errors="replace")
        if not server.alive() or "error while attempting to bind" in text:  # a server that cannot bind hangs on
            tail = "\n".join(text.splitlines()[-25:])
            raise RuntimeError(f"the SGLang server failed ({server.process.poll()}); {server.log}:\n{tail}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{server.url}/health_generate", timeout=10).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"the SGLang server at {server.url} was not ready after {timeout_s:.0f}s; see {server.log}")


@contextlib.contextmanager
def real_server(log: Path, profile_name: str = "kimi-k2.5-mini", **kwargs: Any) -> Iterator[RealServer]:
    [server] = start_real_servers([log], profile_name, **kwargs)
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.real_sglang", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="kimi-k2.5-mini")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--log", type=Path, default=Path("var/real-sglang.log"))
    parser.add_argument("--build-only", action="store_true", help="build the env and the model folder, print it")
    args = parser.parse_args(argv)
    if args.build_only:
        sglang_python()
        print(model_dir(args.profile))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    started = time.monotonic()
    with real_server(args.log.resolve(), args.profile, port=args.port) as server:
        print(
            f"SGLang serving {server.served_name} from {server.model} at {server.url} "
            f"(ready in {time.monotonic() - started:.0f}s); log {args.log}; Ctrl-C stops it"
        )
        with contextlib.suppress(KeyboardInterrupt):
            server.process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
