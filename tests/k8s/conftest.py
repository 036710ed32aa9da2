"""The rendered manifests, once per test session."""

import pytest

from k8s_helpers import render_all


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    return render_all()
