"""The memory bench's **files** workload: a coding agent editing five different files, one edit
each, every request carrying its file. Nothing repeats across requests, so the speculation
memory holds no earlier answer to replay: what drafts an edit is the request itself (the file in
the prompt) or, with Predicted Outputs, the file sent as the prediction.
"""

from __future__ import annotations

FILES = [
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
"""(file, edit request) pairs."""
