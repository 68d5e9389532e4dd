#!/usr/bin/env bash
# Builds the SGLang oracle environment (requirements-sglang.txt: sglang 0.5.23's own code and its pins, CPU only: its
# chat layer for the parity tests, its server for tools/real_sglang.py) and links it as .venv-sglang in the repo
# root. The env lives in a cache directory keyed by the sha256 of requirements-sglang.txt, so a machine builds each
# version of the lock once:
#   ${REGEN_CACHE_DIR:-$HOME/.cache/eagle3-regen}/sglang-env-<first 12 hex of the sha256>
# A cached env that still imports is only re-linked (seconds). A build goes into a temporary sibling that is renamed
# into place only once it verified, so a killed build never leaves a directory that looks done.
# Usage: tools/sglang_env.sh    (make sglang-env; PYTHON=python3.11 picks the interpreter)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
lock="$repo/requirements-sglang.txt"
python="${PYTHON:-python3}"
cache="${REGEN_CACHE_DIR:-$HOME/.cache/eagle3-regen}"
key="$(sha256sum "$lock" | cut -c1-12)"
env_dir="$cache/sglang-env-$key"
link="$repo/.venv-sglang"

# What the oracle imports: SGLang's chat layer, and the libraries its tests use besides.
modules=(
  sglang.srt.entrypoints.openai.protocol
  sglang.srt.entrypoints.openai.serving_chat
  sglang.srt.function_call.utils
  sglang.srt.function_call.kimik2_detector
  sglang.srt.function_call.deepseekv31_detector
  sglang.srt.function_call.qwen3_coder_detector
  sglang.srt.parser.reasoning_parser
  sglang.srt.parser.template_manager
  sglang.srt.utils.hf_transformers.tokenizer
  sglang.srt.server_args
  tiktoken jsonschema jinja2 orjson regex pydantic
  # What the real server (tools/real_sglang.py) imports beyond the chat layer: each stops its start-up when missing.
  soundfile setproctitle prometheus_client python_multipart interegular xxhash watchfiles blobfile anthropic
  openai_harmony llguidance pynvml scipy
  # The trainers tier (tests/parity/test_trainers_vocab.py): SpecForge's counting and mapping, and what both read.
  datasets specforge.data.preprocessing
)

verify() {  # verify ENV_DIR: every module imports on CPU, and the installed set is exactly the lock
  local dir="$1"
  [[ -x "$dir/bin/python" ]] || return 1
  CUDA_VISIBLE_DEVICES="" "$dir/bin/python" -W ignore - "${modules[@]}" <<'EOF' || return 1
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
EOF
  # pip freeze leaves out pip and setuptools; the lock has both.
  diff <(grep -vE '^(#|pip==|setuptools==)' "$lock" | sed 's/ *#.*//' | grep . | sort -f) \
    <("$dir/bin/python" -m pip freeze --disable-pip-version-check | sort -f) >&2 || return 1
}

link_env() {
  if [[ -e "$link" && ! -L "$link" ]]; then
    echo "sglang_env: $link exists and is not a symlink; move it away" >&2
    exit 1
  fi
  ln -sfn "$env_dir" "$link.tmp.$$"
  mv -T "$link.tmp.$$" "$link"
  echo "sglang env: $env_dir ($(du -sh "$env_dir" | cut -f1)), linked as $link"
}

mkdir -p "$cache"
# One build per cache at a time: a second caller waits, then finds the env done.
exec 9>"$cache/sglang-env.lock"
flock 9
# Holding the lock, any temporary env left here is from a build that was killed: remove it.
rm -rf -- "$cache"/sglang-env-*.tmp.*

if [[ -d "$env_dir" ]]; then
  if verify "$env_dir"; then
    link_env
    exit 0
  fi
  echo "sglang_env: $env_dir does not verify; rebuilding it" >&2
  rm -rf -- "$env_dir"
fi

tmp="$(mktemp -d "$cache/sglang-env-$key.tmp.XXXXXX")"
chmod go+rx "$tmp"  # mktemp makes it private; the env is for anyone on the machine to read
log="$cache/sglang-env-$key.log"
# pip's own scratch files too, so that a killed build leaves nothing outside the cache (the cleanup above takes it).
export TMPDIR="$tmp-pip"
mkdir "$TMPDIR"
trap 'rm -rf -- "$tmp" "$TMPDIR"' EXIT
echo "sglang_env: building $env_dir from requirements-sglang.txt (~3 GB of wheels, a few minutes; log: $log)" >&2

"$python" -c 'import sys; assert sys.version_info >= (3, 11), "sglang 0.5.23 needs Python 3.11+"'
"$python" -m venv "$tmp"
pip=("$tmp/bin/python" -m pip --disable-pip-version-check --no-input)
if ! {
  "${pip[@]}" install --no-deps "$(grep -m1 '^pip==' "$lock" | sed 's/ *#.*//')" &&
    # A full lock, so --no-deps: nothing outside it comes in (sglang's own metadata would pull in its GPU kernels).
    "${pip[@]}" install --no-deps --only-binary=:all: -r "$lock"
} >"$log" 2>&1; then
  echo "sglang_env: pip failed; the last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
fi

# The venv was made at the temporary path: point its scripts (shebangs, activate) at the final one.
{ grep -rlIF -- "$tmp" "$tmp/bin" || true; } | while read -r f; do sed -i "s|$tmp|$env_dir|g" "$f"; done
if ! verify "$tmp"; then
  echo "sglang_env: the new env does not verify (imports above, or it differs from requirements-sglang.txt)" >&2
  exit 1
fi
mv "$log" "$tmp/build.log"
mv -T "$tmp" "$env_dir"
rm -rf -- "$TMPDIR"
trap - EXIT
link_env
