"""Write the bundled sample datasets (data/samples/) deterministically: `python tools/make_samples.py`.

B1_glaive: function-calling conversations with tools, as OpenAI messages (some with a tool call and its result in
history). B2_opencodeinstruct: coding instructions in OpenCodeInstruct's input/output columns. C1_multiturn: multi-turn
conversations regenerated on-policy, ShareGPT chats and OpenAI tool conversations; each tool's parameters allow one
value, so a call the model makes may be the dataset's call exactly (its recorded result is then reused) or another
(the conversation ends there). A few rows are broken on purpose (malformed JSON, no user turn, a duplicate) so that
every run shows rejections being counted.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "samples"

FUNCTIONS = [
    ("get_weather", "Get the current weather for a city", {"city": "string", "unit": "string"}),
    ("get_stock_price", "Get the current stock price", {"symbol": "string"}),
    (
        "convert_currency",
        "Convert an amount between currencies",
        {"amount": "number", "from": "string", "to": "string"},
    ),
    ("search_recipes", "Search recipes by ingredient", {"ingredient": "string", "max_results": "integer"}),
    ("calculate_bmi", "Calculate the body mass index", {"weight_kg": "number", "height_m": "number"}),
]
CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Hanoi", "Quito", "Perth"]
TOPICS = [
    "a binary search",
    "a linked list reversal",
    "an LRU cache",
    "a trie",
    "merge sort",
    "a rate limiter",
    "Dijkstra's algorithm",
    "a JSON pretty-printer",
    "run-length encoding",
    "matrix multiplication",
]
LANGS = ["Python", "Rust", "Go", "TypeScript", "C++", "Java"]


def tool(name: str, description: str, params: dict[str, str]) -> dict:
    properties = {p: {"type": t, "description": f"the {p}"} for p, t in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(params)[:1]},
        },
    }


def glaive_rows(rng: random.Random) -> list[str]:
    rows = []
    for i in range(36):
        chosen = rng.sample(FUNCTIONS, rng.randint(1, 2))
        tools = [tool(*f) for f in chosen]
        city = rng.choice(CITIES)
        name = chosen[0][0]
        messages: list[dict[str, object]] = [
            {"role": "system", "content": "You are a helpful assistant with access to functions."}
        ]
        messages.append(
            {"role": "user", "content": f"Request {i}: can you help me with {name.replace('_', ' ')} for {city}?"}
        )
        if i % 3 == 0:
            args = json.dumps({next(iter(chosen[0][2])): city})
            messages += [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
                    ],
                },
                {"role": "tool", "tool_call_id": f"call_{i}", "content": json.dumps({"result": rng.randint(1, 99)})},
                {"role": "assistant", "content": f"The result for {city} is ready."},
                {"role": "user", "content": "Thanks! And what does that mean for tomorrow?"},
            ]
        messages.append({"role": "assistant", "content": "A reference answer that the target model regenerates."})
        rows.append(json.dumps({"messages": messages, "tools": tools}, ensure_ascii=False))
    rows.append(rows[4])  # an exact duplicate, common in merged sets
    rows.append('{"messages": [{"role": "user", "content": "truncated li')  # malformed JSON
    rows.append(json.dumps({"messages": [{"role": "assistant", "content": "I start the conversation."}]}))
    rows.append(json.dumps({"messages": [{"role": "wizard", "content": "unknown role"}]}))
    return rows


def opencodeinstruct_rows(rng: random.Random) -> list[str]:
    rows = []
    for i in range(48):
        topic, lang = rng.choice(TOPICS), rng.choice(LANGS)
        rows.append(
            json.dumps(
                {
                    "id": f"oci-{i:04d}",
                    "input": f"Implement {topic} in {lang}. Explain the time complexity. (task {i})",
                    "output": "```\n# reference solution\n```",
                    "domain": rng.choice(["generic", "algorithmic"]),
                    "generation_algorithm": "self-instruct",
                    "llm_judgement": '{"score": 5}',
                    "unit_tests": "[]",
                    "tests_execution_status": "[]",
                    "average_test_score": "1",
                }
            )
        )
    rows.append(json.dumps({"id": "oci-empty", "input": "   ", "output": "nothing to ask"}))
    return rows


def multiturn_rows(rng: random.Random) -> list[str]:
    rows = []
    for i in range(12):  # ShareGPT chats of two to four user turns
        topic, lang = rng.choice(TOPICS), rng.choice(LANGS)
        questions = [
            f"Chat {i}: how would you write {topic} in {lang}?",
            "Can you make it faster?",
            "What are the edge cases I should test?",
            "Summarize the whole thing in two sentences.",
        ][: rng.randint(2, 4)]
        turns = [{"from": "system", "value": "You are a careful programming tutor."}]
        for t, question in enumerate(questions, 1):
            turns += [{"from": "human", "value": question}, {"from": "gpt", "value": f"Reference {i}.{t}, off-policy."}]
        rows.append(json.dumps({"id": f"sharegpt-{i:03d}", "conversations": turns}, ensure_ascii=False))
    for i in range(12):  # OpenAI tool conversations: a call, its result, an answer, a follow-up
        city = CITIES[i % len(CITIES)]
        parameters = {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": [city]}, "unit": {"type": "string", "enum": ["celsius"]}},
            "required": ["city"],
        }
        tools = [
            {
                "type": "function",
                "function": {"name": "get_weather", "description": "Weather", "parameters": parameters},
            }
        ]
        messages: list[dict[str, object]] = [
            {"role": "system", "content": "You are a helpful assistant with access to functions."},
            {"role": "user", "content": f"Conversation {i}: what is the weather in {city}?"},
        ]
        if i % 3 == 2:  # the dataset's assistant answered without calling
            messages.append({"role": "assistant", "content": f"Reference {i}.1, off-policy: it is mild."})
        else:
            call = {"name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}
            messages += [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": f"w{i}", "type": "function", "function": call}],
                },
                {"role": "tool", "tool_call_id": f"w{i}", "content": json.dumps({"celsius": rng.randint(-5, 35)})},
                {"role": "assistant", "content": f"Reference {i}.2, off-policy: here is the weather."},
            ]
        messages += [
            {"role": "user", "content": "Should I take an umbrella?"},
            {"role": "assistant", "content": f"Reference {i}.3, off-policy: perhaps."},
        ]
        rows.append(json.dumps({"messages": messages, "tools": tools}, ensure_ascii=False))
    rows.append(rows[1])  # a duplicate conversation
    rows.append(json.dumps({"conversations": [{"from": "gpt", "value": "I start the conversation."}]}))
    return rows


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(2026)
    (OUT / "B1_glaive.jsonl").write_text("\n".join(glaive_rows(rng)) + "\n", encoding="utf-8")
    (OUT / "B2_opencodeinstruct.jsonl").write_text("\n".join(opencodeinstruct_rows(rng)) + "\n", encoding="utf-8")
    multiturn = multiturn_rows(random.Random(2027))
    (OUT / "C1_multiturn.jsonl").write_text("\n".join(multiturn) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
