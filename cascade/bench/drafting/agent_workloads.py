"""The memory bench's workloads (``cascade.bench.drafting.memory``), built here, deterministic: an
agent's tool calls, a chained code edit, extractions under one system prompt, edits of five
different files, and plain chat prompts.
"""

from __future__ import annotations

import json

from cascade.bench.prompts import DOMAINS

TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"]}},
    {"name": "search_flights", "description": "Flights between two airports on a date.",
     "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                                                     "destination": {"type": "string"},
                                                     "date": {"type": "string"}},
                    "required": ["origin", "destination", "date"]}},
    {"name": "create_event", "description": "Add an event to the user's calendar.",
     "parameters": {"type": "object", "properties": {"title": {"type": "string"},
                                                     "start": {"type": "string"},
                                                     "minutes": {"type": "integer"}},
                    "required": ["title", "start"]}},
]
SYSTEM = ("You are an assistant that answers only with one tool call, as JSON: "
          '{"name": <tool name>, "arguments": {...}}. Tools:\n'
          + "\n".join(json.dumps(tool) for tool in TOOLS))
EXAMPLES = [
    ("What's the weather in Rome?",
     {"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}),
    ("Find flights from AMS to BER on 2025-02-01.",
     {"name": "search_flights", "arguments": {"origin": "AMS", "destination": "BER",
                                              "date": "2025-02-01"}}),
    ("Add 'lunch with Ana' on 2025-02-03 at 12:30 for 60 minutes.",
     {"name": "create_event", "arguments": {"title": "lunch with Ana",
                                            "start": "2025-02-03T12:30", "minutes": 60}}),
]
REQUESTS = [
    "What's the weather in Paris?", "Find flights from SFO to JFK on 2025-03-14.",
    "Put 'dentist' on my calendar for 2025-03-20 at 09:00, 30 minutes.",
    "Is it cold in Oslo right now? Use fahrenheit.", "Flights from LHR to CDG on 2025-04-02?",
    "Schedule 'team sync' at 2025-03-21 14:00 for 45 minutes.", "Weather in Tokyo, please.",
    "Search flights from BOS to ORD on 2025-05-09.",
]
FILE = '''import json
from pathlib import Path


def load_config(path):
    with open(path) as f:
        return json.load(f)


def save_config(path, config):
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


def merge(base, override):
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result
'''
EDITS = ["Add type hints to load_config.", "Rename `f` to `handle` in save_config.",
         "Make save_config sort the keys.", "Add a docstring to merge.",
         "Use Path.read_text in load_config."]


EXTRACT_SYSTEM = ("Extract the person in the user's note as JSON with the keys name, age, "
                  "city and job, nothing else. Example: "
                  '{"name": "Ana Silva", "age": 31, "city": "Lisbon", "job": "nurse"}')
NAMES = ["Ben Okafor", "Chloe Martin", "Dev Patel", "Eva Novak", "Finn Berg", "Grace Liu",
         "Hugo Rossi", "Ines Costa", "Jon Park", "Kira Sato"]
CITIES = ["Oslo", "Lyon", "Pune", "Graz", "Turku", "Xi'an", "Bari", "Porto", "Busan", "Osaka"]
JOBS = ["teacher", "plumber", "chemist", "pilot", "baker", "lawyer", "nurse", "farmer",
        "editor", "welder"]

FILES = [  # (file, edit request): five different files, one edit each
    ('''import csv


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def total(rows, column):
    return sum(float(row[column]) for row in rows)


def by_key(rows, key):
    groups = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    return groups
''', "Make total skip rows whose value is empty."),
    ('''import time


class Timer:
    def __init__(self, name):
        self.name = name
        self.started = None
        self.elapsed = 0.0

    def __enter__(self):
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.elapsed = time.perf_counter() - self.started
        print(f"{self.name}: {self.elapsed:.3f} s")
        return False
''', "Print milliseconds instead of seconds."),
    ('''from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 1


def subtotal(items):
    return sum(item.price * item.quantity for item in items)


def apply_discount(amount, percent):
    if percent < 0 or percent > 100:
        raise ValueError("percent must be between 0 and 100")
    return amount * (1 - percent / 100)
''', "Add a currency field to Item with the default 'EUR'."),
    ('''import re

WORD = re.compile(r"[a-z']+")


def words(text):
    return WORD.findall(text.lower())


def counts(text):
    result = {}
    for word in words(text):
        result[word] = result.get(word, 0) + 1
    return result


def top(text, n=10):
    return sorted(counts(text).items(), key=lambda pair: -pair[1])[:n]
''', "Use collections.Counter in counts."),
    ('''import os


def find_files(root, suffix):
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(suffix):
                found.append(os.path.join(folder, name))
    return found


def file_sizes(paths):
    return {path: os.path.getsize(path) for path in paths}


def largest(paths, n=5):
    sizes = file_sizes(paths)
    return sorted(sizes, key=sizes.get, reverse=True)[:n]
''', "Return the found files sorted."),
]


def tool_calls() -> list[list[dict]]:
    history = [{"role": "system", "content": SYSTEM}]
    for question, call in EXAMPLES:
        history += [{"role": "user", "content": question},
                    {"role": "assistant", "content": json.dumps(call)}]
    return [history + [{"role": "user", "content": r}] for r in REQUESTS * 2]


def extraction() -> list[list[dict]]:
    """Twenty notes about people, one JSON extraction each, under one system prompt."""
    notes = [f"Met {NAMES[i % 10]} yesterday, {24 + 3 * i % 40} years old, a "
             f"{JOBS[(3 * i) % 10]} from {CITIES[(7 * i) % 10]}." for i in range(20)]
    return [[{"role": "system", "content": EXTRACT_SYSTEM}, {"role": "user", "content": n}]
            for n in notes]


def chat() -> list[list[dict]]:
    prompts = next(d for d in DOMAINS if d.name == "chat").prompts
    return [[{"role": "user", "content": p}] for p in prompts]
