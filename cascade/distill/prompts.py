"""The prompt set the target answers to make distillation data: chat, explanation, code, writing.

Prompts are templates crossed with subjects. Subjects are split by a stable hash, so held-out
prompts (for measuring acceptance) share no subject with training prompts.
"""

from __future__ import annotations

import hashlib
import random

TEMPLATES = {
    "explain": ["Explain {} in simple terms.", "What is {}?", "How does {} work?",
                "Can you give me a short introduction to {}?", "Why is {} important?",
                "What are the main ideas behind {}?"],
    "advice": ["Give me three tips for {}.", "What is a good way to get started with {}?",
               "What mistakes should I avoid when {}?", "How can I get better at {}?"],
    "code": ["Write a Python function to {}.", "How do I {} in Python?",
             "Show me a short Python example to {}.", "Write a JavaScript function to {}."],
    "writing": ["Write a short poem about {}.", "Write a friendly email about {}.",
                "Write a two-sentence story about {}.", "Summarize the idea of {} in one paragraph."],
}

SUBJECTS = {
    "explain": [
        "photosynthesis", "gravity", "the water cycle", "black holes", "inflation", "vaccines",
        "the internet", "machine learning", "neural networks", "climate change", "democracy",
        "the stock market", "electricity", "DNA", "the immune system", "plate tectonics",
        "compound interest", "the French Revolution", "blockchain", "quantum computing",
        "renewable energy", "the solar system", "evolution", "supply and demand", "encryption",
        "the human heart", "volcanoes", "rainbows", "the moon's phases", "antibiotics",
        "operating systems", "databases", "recursion", "the speed of light", "magnetism",
        "sleep", "nutrition", "the Roman Empire", "the printing press", "jet engines",
        "batteries", "earthquakes", "tides", "memory in the brain", "GPS", "weather forecasts",
    ],
    "advice": [
        "learning a new language", "running a marathon", "saving money", "public speaking",
        "studying for exams", "cooking at home", "working from home", "learning to code",
        "writing a resume", "gardening", "taking better photos", "staying focused",
        "making new friends", "traveling on a budget", "reading more books", "learning guitar",
        "sleeping better", "managing stress", "job interviews", "starting a small business",
        "keeping a journal", "drinking more water", "hiking safely", "baking bread",
        "organizing a closet", "negotiating a salary", "learning chess", "painting",
    ],
    "code": [
        "reverse a string", "check if a number is prime", "sort a list of numbers",
        "count the words in a sentence", "read a file line by line", "find the maximum in a list",
        "compute the factorial of a number", "return the Fibonacci sequence",
        "remove duplicates from a list", "check if a string is a palindrome",
        "merge two dictionaries", "convert Celsius to Fahrenheit", "flatten a nested list",
        "find the most common element in a list", "validate an email address",
        "compute the average of a list", "reverse the words in a sentence",
        "capitalize every word", "count vowels in a string", "find the second largest number",
        "check if two strings are anagrams", "generate a random password",
        "parse a date string", "sum the digits of a number", "find common elements of two lists",
        "convert a list to a comma separated string", "compute the greatest common divisor",
        "check for balanced parentheses",
    ],
    "writing": [
        "the ocean", "autumn leaves", "a rainy day", "friendship", "a cup of coffee",
        "the city at night", "a lost cat", "the first day of school", "mountains", "the stars",
        "a birthday party", "an old library", "a summer picnic", "a train journey", "snow",
        "a team meeting", "a new job", "a garden in spring", "the sunrise", "a quiet forest",
    ],
}


def _is_held_out(subject: str, fraction: float) -> bool:
    digest = hashlib.sha256(subject.encode()).digest()
    return digest[0] / 256 < fraction


def prompt_set(held_out: bool, fraction: float = 0.15, seed: int = 0) -> list[str]:
    """Training prompts (held_out=False) or held-out prompts, shuffled with ``seed``."""
    prompts = [template.format(subject)
               for kind, templates in TEMPLATES.items()
               for subject in SUBJECTS[kind] if _is_held_out(subject, fraction) == held_out
               for template in templates]
    random.Random(seed).shuffle(prompts)
    return prompts


CODE_TEMPLATES = [
    "Explain what this Python function does:\n```python\n{}\n```",
    "Write a docstring for this function:\n```python\n{}\n```",
    "How could this code be improved?\n```python\n{}\n```",
    "Write a unit test for this function:\n```python\n{}\n```",
    "Explain this code to a beginner, step by step:\n```python\n{}\n```",
]
QUESTION_TEMPLATES = [
    "What does the Python function `{name}` in the `{module}` module do?",
    "When would I use `{module}.{name}` in Python?",
    "Explain this in plain words: {doc}",
]


def _functions(path, max_chars: int):
    import ast
    import textwrap

    source = path.read_text(errors="replace")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            text = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
            if 80 < len(text) <= max_chars:
                yield node.name, text, ast.get_docstring(node)


def code_prompts(limit: int = 6000, seed: int = 0, max_chars: int = 700) -> list[str]:
    """Prompts about functions of the Python standard library (for training only): explain,
    document, review or test the code; questions about it; its docstring's first sentence."""
    import sysconfig
    from pathlib import Path

    rng = random.Random(seed)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prompts = []
    for path in sorted(stdlib.glob("*.py")):
        for name, text, doc in _functions(path, max_chars):
            prompts.append(rng.choice(CODE_TEMPLATES).format(text))
            first = (doc or "").strip().split("\n\n")[0].replace("\n", " ")
            template = rng.choice(QUESTION_TEMPLATES if first else QUESTION_TEMPLATES[:2])
            prompts.append(template.format(name=name, module=path.stem, doc=first))
    rng.shuffle(prompts)
    return prompts[:limit]


def training_prompts(seed: int = 0) -> list[str]:
    """The templated prompts outside the held-out subjects plus the standard-library prompts."""
    prompts = prompt_set(held_out=False, seed=seed) + code_prompts(seed=seed)
    random.Random(seed).shuffle(prompts)
    return prompts


DOC_TEMPLATES = [
    "Summarize this in two sentences:\n\n{}",
    "Explain this to a beginner:\n\n{}",
    "What is the main point of the following text?\n\n{}",
    "Write a short Python example that illustrates this:\n\n{}",
    "Rewrite this in simpler words:\n\n{}",
    "What questions might someone ask about this? Answer one of them.\n\n{}",
]


def doc_prompts(texts: tuple[str, ...], limit: int = 20000, seed: int = 0,
                max_chars: int = 500) -> list[str]:
    """Prompts about documentation paragraphs (for training only): the first paragraph of each
    of ``texts`` (``features.data.prose_corpus``) under one of ``DOC_TEMPLATES``. Thousands of
    subjects where the templated chat prompts have a few hundred."""
    rng = random.Random(seed)
    prompts = []
    for text in texts:
        first = text.strip().split("\n\n")[0].strip()
        if 80 <= len(first):
            prompts.append(rng.choice(DOC_TEMPLATES).format(first[:max_chars]))
    rng.shuffle(prompts)
    return prompts[:limit]
