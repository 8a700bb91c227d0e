"""Where the tests find the repository, their own data and the shared QA data, from any folder
of the test tree."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TEST_DATA = TESTS / "data"
SHARED_DATA = REPO.parent / "shared" / "data"
