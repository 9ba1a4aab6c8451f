import os
import tempfile
from pathlib import Path

# Prefect state (ephemeral server database, cached task results) goes to a
# throw-away folder per test session, never the user's ~/.prefect.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="rollscale-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def dvc_study(tmp_path_factory):
    """The whole study on a small config through `dvc repro`, once per test session."""
    from tests.test_dvc import build_study

    return build_study(tmp_path_factory.mktemp("study"))
