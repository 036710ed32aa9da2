"""Fixtures shared by the fuzz tests."""

import pytest

from tokenizers_fixture import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    """The tests' tiny real tokenizer (eos <|endoftext|>, a chat template)."""
    return build_tokenizer()
