"""The SGLang oracle from the project's side: `sglang_oracle.py` running in the pinned SGLang environment
(`make sglang-env`) for one served profile, asked one case at a time over a pipe (hypothesis draws cases one by one,
and shrinks a failing one against the same running process)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from hypothesis import HealthCheck, settings

# Every differential test: this many cases, the same ones on every run, each as slow as the oracle is.
CASES = 2_000
DIFFERENTIAL = settings(
    max_examples=CASES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("sglang_oracle.py")


def oracle_python() -> Path:
    """The SGLang environment's interpreter; its absence is a failure that says how to build it, never a skip."""
    python = Path(os.environ.get("SGLANG_ORACLE_PYTHON", ROOT / ".venv-sglang" / "bin" / "python"))
    if not python.exists():
        raise RuntimeError(f"no SGLang environment at {python}: run `make sglang-env` (docs/parity.md)")
    return python


@dataclass(frozen=True)
class Served:
    """How the oracle serves one profile: SGLang's launch flags and the model config its chat layer reads."""

    tokenizer: Path
    tool_call_parser: str
    reasoning_parser: str
    model_type: str
    architecture: str
    multimodal: bool = False
    trust_remote_code: bool = False
    chat_template: Path | None = None

    def flags(self) -> list[str]:
        flags = [
            f"--tokenizer={self.tokenizer}",
            f"--tool-call-parser={self.tool_call_parser}",
            f"--reasoning-parser={self.reasoning_parser}",
            f"--model-type={self.model_type}",
            f"--architecture={self.architecture}",
        ]
        flags += ["--multimodal"] * self.multimodal + ["--trust-remote-code"] * self.trust_remote_code
        return flags + ([f"--chat-template={self.chat_template}"] if self.chat_template else [])


class Oracle:
    """One SGLang chat layer in its own process; `ask` sends a case and reads SGLang's answer to it."""

    def __init__(self, served: Served) -> None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.stderr = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 (open while the process lives)
        self.process = subprocess.Popen(
            [str(oracle_python()), str(SCRIPT), *served.flags()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            encoding="utf-8",
            env=env,
        )
        ready = self._read()
        if ready != {"ready": True}:
            raise RuntimeError(f"the SGLang oracle did not start: {ready}")
        self.asked = 0

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait(30)
            self.stderr.seek(0)
            raise RuntimeError(f"the SGLang oracle exited ({code}):\n{self.stderr.read()[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, case: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(case, ensure_ascii=False) + "\n")
        self.process.stdin.flush()
        self.asked += 1
        answer = self._read()
        if "crashed" in answer:
            raise AssertionError(f"SGLang's own code crashed on the case: {answer['crashed']}")
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(60)
        self.stderr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
