"""A tiny real tokenizer for the gateway tests."""

import pytest

from tokenizers_fixture import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()
