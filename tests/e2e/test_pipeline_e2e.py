"""The whole DAG through a real Airflow scheduler (LocalExecutor on PostgreSQL), against the SGLang-protocol
simulator, publishing through boto3 to an S3 HTTP API on loopback. Then: what landed is exactly right."""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import requests
import yaml
import zstandard

from regen.chat import ChatRenderer
from regen.sglang.client import answer_id_of
from regen.simulator.defects import BY_NAME
from regen_airflow.usage import parse_usage_line
from tests.conftest import kept_keys, kept_records
from tests.deepseek_style import deepseek_profile
from tools.devstack import DAG_ID, Simulator, Stack, start_simulator, wait_until

pytestmark = pytest.mark.e2e
BUCKET = "regen-e2e"
EXPECTED_PROMPTS = {"B1_glaive": 36, "B2_opencodeinstruct": 48}


GOOD = list(EXPECTED_PROMPTS)
# Files of a version besides those its manifest lists: the bookkeeping that makes each stage idempotent.
BOOKKEEPING = re.compile(
    r"(manifest\.json|prompts/prepare\.json|raw/shard-\d+\.generation\.json|reports/shard-\d+(\.generate|\.validate)?\.json)$"
)  # the config also has B3_missing, whose source does not exist
USER_PROFILE = "my-model"
DEEPSEEK_PROFILE = "my-deepseek"  # DeepSeek-style, config only: its own special tokens, call ids the function name
# A user's own template over the mini vocabulary: ChatML-shaped, no reasoning, tools as JSON, and calls as tagged JSON
# between two of the vocabulary's tokens, as its profile declares them.
USER_TEMPLATE = (
    "{% if tools %}<|im_system|>tools<|im_middle|>{{ tools | tojson }}<|im_end|>{% endif %}"
    "{% for m in messages %}<|im_system|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}<|tool_call_begin|>\n"
    '{"name": {{ c.function.name | tojson }}, "arguments": {{ c.function.arguments | tojson }}}\n<|tool_call_end|>'
    "{% endfor %}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
)


def user_profile(folder: Path) -> dict[str, Any]:
    """A profile declared only in the config: a tokenizer directory and a template file, no code."""
    from regen.tokenizers.kimi_mini import ensure_mini_tokenizer

    (folder / "tokenizer").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / "tokenizer" / name).write_bytes((ensure_mini_tokenizer() / name).read_bytes())
    (folder / "template.jinja").write_text(USER_TEMPLATE)
    return {
        "tokenizer": "tokenizer",
        "chat_template": "template.jinja",
        "generation_suffix": "<|im_assistant|>assistant<|im_middle|>",
        "eos_tokens": ["<|im_end|>"],
        "role_tokens": ["<|im_system|>", "<|im_assistant|>"],
        "tool_calls": {"format": "tagged_json", "call_begin": "<|tool_call_begin|>", "call_end": "<|tool_call_end|>"},
        "max_prompt_tokens": 4096,
        "served_model_names": [USER_PROFILE],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack on the project's config plus a dataset whose source is missing."""
    project = Path(__file__).resolve().parents[2] / "config" / "regen.yaml"
    config = yaml.safe_load(project.read_text())
    for dataset in config["datasets"].values():
        dataset["paths"] = [str((project.parent / path).resolve()) for path in dataset["paths"]]
    config["datasets"]["B3_missing"] = {"format": "input_output", "paths": [str(project.parent / "absent.jsonl")]}
    config["defaults"]["storage_root"] = f"s3://{BUCKET}/runs"  # where the "Drafter data" page looks
    config["defaults"]["prepare_part_prompts"] = 24  # a run in shards of 12 prepares B2 in two parts (the Celery test)
    # The bucket, and two roots allowed only so that plan's later checks (a write probe) are reached through the DAG.
    config["governance"]["allowed_storage_roots"] = [f"s3://{BUCKET}", f"s3://{BUCKET}-missing", "/proc/eagle3-regen"]
    folder = tmp_path_factory.mktemp("config")
    config.setdefault("profiles", {})[USER_PROFILE] = user_profile(folder)  # beside the project's own
    (folder / "deepseek").mkdir()
    declared = deepseek_profile(folder / "deepseek", DEEPSEEK_PROFILE)
    declared.update(tokenizer="deepseek/tokenizer", chat_template="deepseek/template.jinja")
    config["profiles"][DEEPSEEK_PROFILE] = declared
    config_path = folder / "regen.yaml"
    config_path.write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("REGEN_CONFIG", str(config_path))
        # Every task's S3 request goes through the fault proxy: S3's 500s, 503 SlowDowns and dropped connections.
        airflow = tmp_path_factory.mktemp("airflow")
        with Stack(airflow, purpose="e2e", with_s3=True, s3_fault_rate=0.1) as running:
            running.s3_client().create_bucket(Bucket=BUCKET)
            yield running


@pytest.fixture(scope="module")
def finished_run(stack: Stack) -> dict[str, Any]:
    run_id = stack.trigger({"datasets": GOOD, "endpoints": [stack.simulator], "storage_root": f"s3://{BUCKET}/runs"})
    state = stack.wait_for_run(run_id, timeout_s=600)
    states = stack.task_states(run_id)
    assert state == "success", f"run {state}: {states}\nlogs: {stack.home / 'logs'}"
    return {"run_id": run_id, "report": stack.xcom(run_id, "report"), "states": states}


def s3_json(stack: Stack, key: str) -> Any:
    return json.loads(stack.s3_client().get_object(Bucket=BUCKET, Key=key)["Body"].read())


def s3_table(stack: Stack, key: str) -> list[dict[str, Any]]:
    body = stack.s3_client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return list(pq.read_table(io.BytesIO(body)).to_pylist())


def s3_raw(stack: Stack, key: str) -> list[dict[str, Any]]:
    body = stack.s3_client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return [json.loads(line) for line in zstandard.ZstdDecompressor().decompressobj().decompress(body).splitlines()]


def s3_lines(stack: Stack, key: str) -> list[dict[str, Any]]:
    body = stack.s3_client().get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
    return [json.loads(line) for line in body.splitlines()]


def test_every_stage_ran_per_shard(finished_run: dict[str, Any]) -> None:
    states = finished_run["states"]
    # No dataset of this run has more than one part (B2 in two parts is the Celery test's run): nothing to map.
    assert [(task, state) for task, _, state in states if task == "prepare_part"] == [("prepare_part", "skipped")]
    assert all(state == "success" for task, _, state in states if task != "prepare_part")
    assert len([s for s in states if s[0] == "process_shard.generate_shard"]) == 2  # one 2000-prompt shard each
    assert len([s for s in states if s[0] == "deliver_dataset.verify_dataset"]) == 2  # each dataset read back whole


def test_every_task_logs_what_it_cost_the_machine(stack: Stack, finished_run: dict[str, Any]) -> None:
    """Each task's log has its usage line (regen_airflow.usage, from the task process), naming the task."""
    for task_id, map_index, state in finished_run["states"]:
        if state == "skipped":  # no process ran (prepare_part, with no dataset in parts)
            continue
        usage = parse_usage_line(stack.task_log(finished_run["run_id"], task_id, map_index))
        assert usage is not None, f"{task_id}[{map_index}]: no usage line"
        assert (usage["task"], usage["map_index"]) == (task_id, map_index)
        assert usage["cpu_s"] > 0 and usage["peak_rss_mb"] > 50  # a Python process with Airflow loaded


def test_tasks_inherit_the_profile_the_scheduler_preloaded(stack: Stack, finished_run: dict[str, Any]) -> None:
    """The scheduler preloads the default profile (plugins/airflow_local_settings.py): the tasks forked from it use
    that renderer and never load the tokenizer themselves."""
    tasks = [(t, i) for t, i, _ in finished_run["states"] if t.startswith(("plan", "process_shard.", "check_server"))]
    assert any(t == "process_shard.validate_shard" for t, _ in tasks)
    for task_id, map_index in tasks:
        log = stack.task_log(finished_run["run_id"], task_id, map_index)
        assert "loading profile" not in log, f"{task_id}[{map_index}] loaded its profile itself"


def test_every_sample_lands_exactly_once_with_the_servers_own_ids(stack: Stack, finished_run: dict[str, Any]) -> None:
    sent = {r["rid"]: r for r in (json.loads(x) for x in Path(stack.record).read_text().splitlines())}
    published = {d["dataset"]: d for d in finished_run["report"]["datasets"]}
    assert set(published) == set(EXPECTED_PROMPTS)
    for dataset, expected in EXPECTED_PROMPTS.items():
        manifest_key = published[dataset]["manifest"].removeprefix(f"s3://{BUCKET}/")
        manifest = s3_json(stack, manifest_key)
        prefix = manifest_key.removesuffix("manifest.json")
        prompts = {r["id"]: r for key in s3_keys(stack, prefix + "prompts/", ".parquet") for r in s3_table(stack, key)}
        root = manifest["root"].removeprefix(f"s3://{BUCKET}/") + "/"  # manifest keys are relative to the root
        raw = {r["id"]: r for s in manifest["shards"] for r in s3_raw(stack, root + s["raw"])}
        train = [r for s in manifest["shards"] for key in kept_keys(s) for r in s3_table(stack, root + key)]

        assert len(prompts) == expected and kept_records(manifest) == expected
        assert sorted(r["id"] for r in train) == sorted(prompts)  # every sample, exactly once
        for record in train:
            prompt_ids = prompts[record["id"]]["prompt_ids"]
            server = sent[raw[record["id"]]["rid"]]
            assert server["input_ids"] == prompt_ids  # the prompt went over the wire untouched
            assert record["input_ids"] == prompt_ids + server["output_ids"]
            assert record["loss_mask"] == [0] * len(prompt_ids) + [1] * len(server["output_ids"])
            assert record["input_ids"][-1] == 163586 and record["verdict"] == "ok"
        assert manifest["profile"]["generation_suffix"] == "<|im_assistant|>assistant<|im_middle|><think>"
        assert manifest["prepare"]["total"] == manifest["prepare"]["kept"] + manifest["prepare"]["dropped"]
        assert manifest["prepare"]["rows_read"] == manifest["prepare"]["total"]  # turns: final, one prompt per row
        rejected = s3_lines(stack, prefix + "rejected/prepare.jsonl")
        assert len(rejected) == manifest["prepare"]["dropped"] > 0
        # Through S3's faults: every file of the version there, and nothing else but its bookkeeping.
        held = {key.removeprefix(root) for key in s3_keys(stack, prefix, "")}
        assert set(manifest["files"]) <= held
        assert [key for key in held if key not in manifest["files"] and not BOOKKEEPING.search(key)] == []
        assert published[dataset]["verified"]["records_checked"] == expected  # read back whole before its event
    faults = stack.s3_faults()
    assert faults.get("500", 0) and faults.get("503", 0) and faults.get("reset", 0), faults


def test_on_policy_conversations_regenerate_turn_by_turn_through_airflow(stack: Stack) -> None:
    """C1_multiturn (ShareGPT chats and OpenAI tool conversations, turns: on_policy): every turn k > 1 was sent a
    prompt holding the answers the model gave for turns < k, and a call that is not the dataset's ended its
    conversation with the reason; every answered turn is published as its own record, exactly as sent."""
    from regen.profiles import lookup
    from tests.turns import by_conversation, check_histories

    dataset, storage_root = "C1_multiturn", f"s3://{BUCKET}/on-policy"
    run_id = stack.trigger({"datasets": [dataset], "endpoints": [stack.simulator], "storage_root": storage_root})
    assert stack.wait_for_run(run_id, timeout_s=300) == "success", stack.task_states(run_id)
    [published] = stack.xcom(run_id, "report")["datasets"]
    manifest_key = published["manifest"].removeprefix(f"s3://{BUCKET}/")
    manifest, prefix = s3_json(stack, manifest_key), manifest_key.removesuffix("manifest.json")
    root = manifest["root"].removeprefix(f"s3://{BUCKET}/") + "/"
    raw = {r["id"]: r for s in manifest["shards"] for r in s3_raw(stack, root + s["raw"])}
    train = {r["id"]: r for s in manifest["shards"] for key in kept_keys(s) for r in s3_table(stack, root + key)}
    rejected = s3_lines(stack, prefix + "rejected/" + "shard-00000-generate.jsonl")
    sent = {r["rid"]: r for r in (json.loads(x) for x in Path(stack.record).read_text().splitlines())}
    by_turn = {answer_id: sent[answer["rid"]] for answer_id, answer in raw.items()}

    assert manifest["prepare"]["kept"] == 24  # conversations
    turns = by_conversation([*raw, *(r["id"] for r in rejected)])
    assert len(turns) == 24 and sum(map(len, turns.values())) == manifest["stages"]["generate"]["total"] == 66
    assert sorted(train) == sorted(raw) and kept_records(manifest) == len(raw)  # each turn its own record, once
    for answer_id, record in train.items():
        server = by_turn[answer_id]
        assert server["input_ids"] == raw[answer_id]["prompt_ids"]
        assert record["input_ids"] == server["input_ids"] + server["output_ids"]
        assert record["loss_mask"] == [0] * len(server["input_ids"]) + [1] * len(server["output_ids"])
    tokenizer = ChatRenderer(lookup("kimi-k2.5-mini")).tokenizer
    assert check_histories(by_turn, tokenizer) > 40
    diverged = [r for r in rejected if r["reason"] == "diverged_tool_call"]
    assert diverged and manifest["stages"]["generate"]["dropped_by_reason"] == {"diverged_tool_call": len(diverged)}
    asked = {answer_id_of(r["rid"]) for r in sent.values()}
    assert not asked & {r["id"] for r in diverged}  # a turn after the divergence is never requested
    assert published["verified"]["records_checked"] == len(raw)


@pytest.mark.parametrize("profile", ["qwen3.6", USER_PROFILE, DEEPSEEK_PROFILE])
def test_a_profile_declared_only_in_the_config_runs_end_to_end_bit_exact(stack: Stack, profile: str) -> None:
    """Qwen3.6 (declared in config/regen.yaml, its real vocabulary) and a user's own model (a tokenizer directory and
    template file declared in this test's config): no code of theirs. On the function-calling dataset the simulator
    answers as the profile (its reasoning tokens, its tool-call grammar, its EOS): every answer passes the profile's
    own validation, and every record is what the server sent."""
    sim = start_simulator(stack.home, "--profile", profile, "--tool-call-rate", "0.6")
    try:
        run_id = stack.trigger(
            {
                "datasets": ["B1_glaive"],
                "profile": profile,
                "endpoints": [sim.url],
                "storage_root": f"s3://{BUCKET}/profiles",
            }
        )
        assert stack.wait_for_run(run_id, 300) == "success", stack.task_states(run_id)
        sent = {r["rid"]: r for r in sim.records()}
    finally:
        sim.stop()
    [published] = stack.xcom(run_id, "report")["datasets"]
    manifest_key = published["manifest"].removeprefix(f"s3://{BUCKET}/")
    assert manifest_key.startswith(f"profiles/{profile}/B1_glaive/")
    manifest = s3_json(stack, manifest_key)
    roles = manifest["token_roles"]
    assert manifest["profile"]["name"] == profile
    root = manifest["root"].removeprefix(f"s3://{BUCKET}/") + "/"
    raw = {r["id"]: r for shard in manifest["shards"] for r in s3_raw(stack, root + shard["raw"])}
    train = [r for shard in manifest["shards"] for key in kept_keys(shard) for r in s3_table(stack, root + key)]
    # The same rows are prepared for every profile: no prompt is too long or refused by the template.
    assert len(train) == len(raw) == kept_records(manifest) == EXPECTED_PROMPTS["B1_glaive"]
    suffix, reasoning_end = roles["generation_suffix_ids"], roles["reasoning_end_id"]
    grammar = roles["tool_call_ids"]
    assert (
        grammar["format"]
        == {"qwen3.6": "tagged_xml", USER_PROFILE: "tagged_json", DEEPSEEK_PROFILE: "sections"}[profile]
    )
    calling = 0
    for record in train:
        server = sent[raw[record["id"]]["rid"]]
        assert record["input_ids"] == server["input_ids"] + server["output_ids"]  # bit-exact, prompt and answer
        assert server["input_ids"][-len(suffix) :] == suffix  # rendered by the profile's template
        assert record["input_ids"][-1] in roles["eos_ids"]
        assert (reasoning_end in server["output_ids"]) == (reasoning_end is not None)
        calling += grammar["call_begin"] in server["output_ids"]
    verdict_files = [key for key in manifest["files"] if key.endswith("-verdicts.parquet")]
    verdicts = [v for key in verdict_files for v in s3_table(stack, root + key)]
    assert calling == sum(v["tool_calls"] > 0 for v in verdicts) > len(train) // 4  # calls kept, each one counted
    # Every call the server wrote was published: the valid answers all kept, none lost for its call id.
    written = sum(sent[r["rid"]]["output_ids"].count(grammar["call_begin"]) for r in raw.values())
    assert sum(v["tool_calls"] for v in verdicts) == written


def test_each_dataset_is_an_asset_and_the_handoff_dag_verifies_what_was_published(
    stack: Stack, finished_run: dict[str, Any]
) -> None:
    events = stack.call("GET", "/assets/events", params={"limit": 100})["asset_events"]
    mine = {e["extra"]["dataset"]: e for e in events if e["source_run_id"] == finished_run["run_id"]}
    published = {d["dataset"]: d for d in finished_run["report"]["datasets"]}
    assert sorted(mine) == sorted(EXPECTED_PROMPTS)
    for dataset, event in mine.items():
        assert event["uri"] == f"s3://{BUCKET}/runs/kimi-k2.5-mini/{dataset}"  # one asset per dataset
        assert event["extra"]["manifest"] == published[dataset]["manifest"]
        assert event["extra"]["records"] == published[dataset]["records"]
        manifest = stack.s3_client().get_object(
            Bucket=BUCKET, Key=event["extra"]["manifest"].removeprefix(f"s3://{BUCKET}/")
        )
        assert event["extra"]["manifest_sha256"] == hashlib.sha256(manifest["Body"].read()).hexdigest()

    def verified() -> set[str]:
        runs = stack.call("GET", "/dags/eagle3_training_handoff/dagRuns", params={"limit": 100})["dag_runs"]
        manifests: set[str] = set()
        for run in runs:
            path = f"/dags/eagle3_training_handoff/dagRuns/{run['dag_run_id']}/taskInstances"
            for ti in stack.call("GET", path, params={"limit": 100})["task_instances"]:
                if ti["task_id"] == "verify_version" and ti["state"] == "success":
                    xcom = f"{path}/verify_version/xcomEntries/return_value"
                    value = stack.call("GET", xcom, params={"map_index": ti["map_index"], "deserialize": True})
                    manifests.add(value["value"]["manifest"])
        return manifests if {d["manifest"] for d in published.values()} <= manifests else set()

    assert wait_until("the hand-off DAG verified both versions", verified, 300)


def s3_keys(stack: Stack, prefix: str, suffix: str) -> list[str]:
    listing = stack.s3_client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []) if o["Key"].endswith(suffix))


@pytest.fixture(scope="module", params=["kimi-k2.5-mini", DEEPSEEK_PROFILE])
def defect_run(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    """A server that plants a defect in about a third of its answers, every kind the profile can carry: Kimi's, and
    a DeepSeek-style profile declared only in the config. All but count mismatches: a server miscounting 2 of 48
    answers on every attempt is a broken server by the fleet's backstop, which fails the shard (tested in
    tests/unit/stages/generate/test_endpoint_faults.py); these are the answers' defects, that validation catches."""
    profile = str(request.param)
    folder = tmp_path_factory.mktemp("defects")
    defects = ("--defect-rate", "0.35", "--defect-count-mismatch-rate", "0")
    sim = start_simulator(folder, "--profile", profile, *defects, "--tool-call-rate", "0.6")
    try:
        run_id = stack.trigger(
            {
                "datasets": GOOD,
                "profile": profile,
                "endpoints": [sim.url],
                "storage_root": f"s3://{BUCKET}/defects-{profile}",
            }
        )
        state = stack.wait_for_run(run_id, timeout_s=600)
        yield {"state": state, "report": stack.xcom(run_id, "report"), "sim": sim, "states": stack.task_states(run_id)}
    finally:
        sim.stop()


def test_with_defects_planted_only_the_valid_answers_are_published(stack: Stack, defect_run: dict[str, Any]) -> None:
    assert defect_run["state"] == "success", defect_run["states"]
    sim: Simulator = defect_run["sim"]
    sent = {r["rid"]: r for r in sim.records()}
    planted = caught = 0
    for dataset in defect_run["report"]["datasets"]:
        manifest_key = dataset["manifest"].removeprefix(f"s3://{BUCKET}/")
        manifest, prefix = s3_json(stack, manifest_key), manifest_key.removesuffix("manifest.json")
        root = manifest["root"].removeprefix(f"s3://{BUCKET}/") + "/"
        raw = {r["id"]: r for s in manifest["shards"] for r in s3_raw(stack, root + s["raw"])}
        train = [r for s in manifest["shards"] for key in kept_keys(s) for r in s3_table(stack, root + key)]
        rejected = {
            r["id"]: r
            for r in s3_lines_if(stack, [prefix + f"rejected/{s['shard']}-validate.jsonl" for s in manifest["shards"]])
        }
        generate_rejected = s3_lines_if(
            stack, [prefix + f"rejected/{s['shard']}-generate.jsonl" for s in manifest["shards"]]
        )
        for record in train:  # nothing defective reached the training data
            assert sent[raw[record["id"]]["rid"]]["defect"] is None
        for sample_id, answer in raw.items():  # every planted defect was caught, for its own reason
            defect = sent[answer["rid"]]["defect"]
            if defect is not None:
                planted += 1
                assert rejected[sample_id]["reason"] == BY_NAME[defect].reason.value, (defect, rejected.get(sample_id))
                caught += 1
            else:
                assert sample_id not in rejected, rejected.get(sample_id)
        assert not generate_rejected  # every answer reached validation
        assert kept_records(manifest) == len(train) == manifest["splits"]["train"] + manifest["splits"]["validation"]
        assert manifest["stages"]["validate"]["dropped"] == len(rejected)
    assert planted == caught > 10


def test_a_server_with_another_tokenizer_fails_the_run_at_check_server(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sim = start_simulator(tmp_path_factory.mktemp("mismatch"), "--text-tokenizer-mismatch")
    try:
        run_id = stack.trigger({"datasets": GOOD, "endpoints": [sim.url], "storage_root": f"s3://{BUCKET}/mismatch"})
        state = stack.wait_for_run(run_id, timeout_s=300)
        states = {task: s for task, _, s in stack.task_states(run_id)}
        answered = sim.stats()["answered"]
    finally:
        sim.stop()
    assert state == "failed"
    assert states["check_server"] == "failed"
    assert "process_shard.generate_shard" not in states or states["process_shard.generate_shard"] != "success"
    assert answered == 1  # the probe, once: no retries, no shard sent a request


def s3_lines_if(stack: Stack, keys: list[str]) -> list[dict[str, Any]]:
    """Lines of those of the files that exist (a shard with nothing rejected writes none)."""
    lines: list[dict[str, Any]] = []
    for key in keys:
        if s3_keys(stack, key, ".jsonl"):
            lines += s3_lines(stack, key)
    return lines


@pytest.mark.parametrize(
    "conf,message",
    [
        pytest.param({"temperature": -0.5}, "temperature", id="negative-temperature"),
        pytest.param({"max_new_tokens": 0}, "max_new_tokens", id="no-tokens"),
        pytest.param({"datasets": []}, "datasets", id="no-datasets"),
        pytest.param({"profile": "gpt-9"}, "profile", id="unknown-profile"),
        pytest.param({"endpoints": ["http://127.0.0.1:9/admin?"]}, "endpoints", id="endpoint-with-a-query"),
        pytest.param({"datasets": ["B1_glaive", "B1_glaive"]}, "datasets", id="dataset-twice"),
    ],
)
def test_the_form_refuses_bad_input_at_trigger(stack: Stack, conf: dict[str, Any], message: str) -> None:
    """What the form's schema can check, the REST API refuses as the UI does: HTTP 400, no run."""
    with pytest.raises(requests.HTTPError) as refused:
        stack.trigger(conf)
    assert refused.value.response.status_code == 400 and message in refused.value.response.text


@pytest.mark.parametrize(
    "conf,message",
    [
        pytest.param({"sampling": {"temperature": 0.5}}, "unknown run parameters ['sampling']", id="unknown-key"),
        pytest.param({"storage_root": "/proc/eagle3-regen"}, "does not take writes", id="unwritable-root"),
        pytest.param({"storage_root": f"s3://{BUCKET}-missing/x"}, "the bucket does not exist", id="missing-bucket"),
        pytest.param({"storage_root": "s3://someone-elses/x"}, "outside governance.allowed_storage_roots", id="root"),
        pytest.param(
            {"endpoints": ["http://exfiltrate.example:30000"]}, "outside governance.allowed_endpoints", id="endpoint"
        ),
    ],
)
def test_bad_input_the_form_cannot_check_fails_plan_in_seconds(
    stack: Stack, conf: dict[str, Any], message: str
) -> None:
    started = time.monotonic()
    run_id = stack.trigger(
        {"datasets": GOOD, "endpoints": [stack.simulator], "storage_root": f"s3://{BUCKET}/bad", **conf}
    )
    state = stack.wait_for_run(run_id, timeout_s=120)
    elapsed = time.monotonic() - started
    states = {task: s for task, _, s in stack.task_states(run_id)}
    attempts = stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/plan")["try_number"]
    log = stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/plan/logs/1", params={"full_content": True})
    assert (state, states["plan"], attempts) == ("failed", "failed", 1)
    assert elapsed < 60, f"took {elapsed:.0f}s"
    assert message in json.dumps(log)
    assert states.get("prepare_dataset") != "success" and states["report"] == "failed"
    assert s3_keys(stack, "bad/", "") == []  # nothing written


def test_a_dataset_that_fails_holds_back_no_other_and_the_run_is_red(stack: Stack) -> None:
    conf = {"datasets": ["B3_missing", "B2_opencodeinstruct"], "endpoints": [stack.simulator]}
    run_id = stack.trigger({**conf, "storage_root": f"s3://{BUCKET}/partial"})
    try:
        state = stack.wait_for_run(run_id, timeout_s=300)
    except TimeoutError as e:
        raise AssertionError(f"{e}: {stack.task_states(run_id)}") from e
    states = {(task, index): s for task, index, s in stack.task_states(run_id)}
    failed_prepare = stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/prepare_dataset/0")
    report_key = next(iter(s3_keys(stack, "partial/kimi-k2.5-mini/runs/", ".json")))
    report = s3_json(stack, report_key)
    assert state == "failed"
    assert (failed_prepare["state"], failed_prepare["try_number"]) == ("failed", 1)  # a missing source: no retries
    assert states[("prepare_dataset", 1)] == "success"
    assert states[("process_shard.generate_shard", 0)] == "success"  # B2's shard was generated all the same
    assert [d["dataset"] for d in report["datasets"]] == ["B2_opencodeinstruct"] and report["datasets"][0]["records"]
    assert report["unpublished"] == ["B3_missing"]
    assert s3_keys(stack, "partial/kimi-k2.5-mini/B2_opencodeinstruct/", "manifest.json")


def published_records(stack: Stack, report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    records = {}
    for dataset in report["datasets"]:
        manifest_key = dataset["manifest"].removeprefix(f"s3://{BUCKET}/")
        manifest = s3_json(stack, manifest_key)
        root = manifest["root"].removeprefix(f"s3://{BUCKET}/") + "/"
        for shard in manifest["shards"]:
            for key in kept_keys(shard):
                records.update({r["id"]: r for r in s3_table(stack, root + key)})
    return records


def stop(stack: Stack, run_id: str) -> None:
    """A run a test triggered, marked failed as an operator does from the UI, so that it no longer holds the
    one-run-at-a-time slot. Not deleted: a run deleted while the scheduler schedules it crashes Airflow 3.3.2's
    scheduler (an ObjectDeletedError raised in its own error handler), and no later run of the stack starts. The
    scheduler may write the run at the same moment, which the API answers with a 500: the mark is tried again."""
    path = f"/dags/{DAG_ID}/dagRuns/{run_id}"

    def failed() -> bool:
        stack.call("PATCH", path, json={"state": "failed"})
        return stack.call("GET", path)["state"] == "failed"

    wait_until(f"run {run_id} marked failed", failed, 60, poll_s=1)


ARTEFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")


def test_the_drafter_data_page_in_a_real_browser(stack: Stack, finished_run: dict[str, Any]) -> None:
    """Headless Chromium signs in to Airflow's UI, finds "Drafter data" in its navigation, reads the published
    counts and sees the plots drawn, and triggers B1_glaive again from its Regenerate button, as the signed-in user."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "install Debian's chromium (apt-get install chromium); .ci/run does"
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    published = {d["dataset"]: d for d in finished_run["report"]["datasets"]}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{stack.api}/")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill("admin")
        page.get_by_role("button", name=re.compile("sign in|log in|login", re.I)).click()
        page.get_by_role("link", name="Drafter data").click()  # Airflow's navigation, the page in its frame
        frame = page.frame_locator("iframe")
        frame.get_by_role("heading", name="Datasets").wait_for(timeout=60_000)
        page.screenshot(path=str(ARTEFACTS / "drafter-data-in-airflow.png"), full_page=True)

        page.goto(f"{stack.api}/drafter/")  # the same page alone, to read it
        for dataset, numbers in published.items():
            row = page.locator(f'tr.dataset[data-dataset="{dataset}"]')
            assert row.locator("td.records").inner_text() == f"{numbers['records']:,}"
            assert finished_run["report"]["run"]["version"] in row.inner_text()
        drawn = page.locator("svg.plot rect").evaluate_all("rects => rects.filter(r => r.getBBox().height > 0).length")
        assert drawn > 10  # histogram and verdict bars, laid out by the browser
        page.screenshot(path=str(ARTEFACTS / "drafter-data.png"), full_page=True)

        page.locator('tr.dataset[data-dataset="B1_glaive"] button.trigger').click()
        dialog = page.locator("#trigger-dialog")
        assert json.loads(dialog.locator("pre").inner_text()) == {"datasets": ["B1_glaive"]}
        page.screenshot(path=str(ARTEFACTS / "drafter-data-regenerate.png"))
        dialog.get_by_role("button", name="Trigger now").click()
        dialog.locator(".outcome a").wait_for(timeout=30_000)
        run_id = dialog.locator(".outcome a").inner_text()
        browser.close()
    run = stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
    stop(stack, run_id)  # it would hold the one-run-at-a-time slot
    assert run["conf"] == {"datasets": ["B1_glaive"]} and run["run_type"] == "manual"


def test_a_login_in_an_endpoint_url_reaches_the_server_and_nothing_the_run_leaves(stack: Stack) -> None:
    """A run given `http://user:pass@host` (a proxy's login): every request carries it as basic auth (the proxy
    refuses any other), and no task log, no XCom and no object the run wrote holds it (the run spec in XCom holds
    `***`; the tasks get the login from the run's params)."""
    from tests.login_proxy import SECRET, USER, LoginProxy

    prefix = "login"
    with LoginProxy(stack.simulator) as proxy:
        conf = {"datasets": ["B1_glaive"], "endpoints": [proxy.with_login()], "storage_root": f"s3://{BUCKET}/{prefix}"}
        run_id = stack.trigger({**conf, "limit": 8})
        state = stack.wait_for_run(run_id, timeout_s=300)
    assert state == "success", stack.task_states(run_id)
    assert any(path == "/generate" for path, _ in proxy.seen) and all(ok for _, ok in proxy.seen)
    assert stack.xcom(run_id, "plan")["endpoints"] == [proxy.url.replace("http://", "http://***@")]
    texts = [json.dumps(stack.xcom(run_id, task)) for task in ("plan", "check_server", "report")]
    ran = [(task, index) for task, index, state in stack.task_states(run_id) if state not in ("skipped", "removed")]
    texts += [stack.task_log(run_id, task, index) for task, index in ran]
    s3 = stack.s3_client()
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/")
            for o in page.get("Contents", [])]  # fmt: skip
    assert any(k.endswith(".jsonl.zst") for k in keys) and any("/runs/" in k for k in keys)
    for key in keys:
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        if key.endswith(".zst"):
            body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        texts.append(body.decode("utf-8", "replace"))
    leaks = [text[max(0, text.find(SECRET) - 200) : text.find(SECRET) + 50] for text in texts if SECRET in text]
    assert not leaks and not any(f"{USER}:" in text for text in texts)


def test_on_two_celery_workers_the_shards_are_shared_and_the_output_is_the_local_executors(
    stack: Stack, finished_run: dict[str, Any]
) -> None:
    """Last in this module: it moves the stack to CeleryExecutor (the machine's Redis as broker, PostgreSQL as
    metadata DB and result backend) with two workers, and runs what `finished_run` ran on LocalExecutor, in shards
    small enough for both workers to share: one dataset, in four shards, prepared in two parts."""
    stack.use_executor("CeleryExecutor")
    conf = {
        "datasets": ["B2_opencodeinstruct"],
        "endpoints": [stack.simulator],
        "storage_root": f"s3://{BUCKET}/celery",
        "shard_size": 12,
    }
    run_id = stack.trigger(conf)
    assert stack.wait_for_run(run_id, timeout_s=600) == "success", stack.task_states(run_id)

    instances = stack.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
    shard_tasks = [t for t in instances["task_instances"] if t["task_id"].startswith("process_shard.")]
    assert len(shard_tasks) == 12  # four shards, three stages each
    assert {t["hostname"] for t in shard_tasks} == {"celery-1", "celery-2"}  # both Celery workers took shards
    parts = [t for t in instances["task_instances"] if t["task_id"] == "prepare_part"]
    assert sorted((t["rendered_map_index"], t["state"]) for t in parts) == [  # B2 was tokenized in two parts
        ("B2_opencodeinstruct/part-00000", "success"),
        ("B2_opencodeinstruct/part-00001", "success"),
    ]

    local = {
        sample_id: record
        for sample_id, record in published_records(stack, finished_run["report"]).items()
        if record["dataset"] == "B2_opencodeinstruct"
    }
    distributed = published_records(stack, stack.xcom(run_id, "report"))
    assert len(local) > 0 and sorted(distributed) == sorted(local)
    for sample_id, record in local.items():
        for column in ("input_ids", "loss_mask", "verdict", "finish_reason"):
            assert distributed[sample_id][column] == record[column], (sample_id, column)
