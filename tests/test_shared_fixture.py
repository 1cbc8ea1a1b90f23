"""shared_fixture reads recorded outputs in place and skips, with the reason, where they are not provided."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import SHARED_FIXTURES_ENV, shared_fixture, shared_fixtures_dir

REPO = Path(__file__).resolve().parents[1]


class TestSharedFixture:
    def test_default_is_shared_fixtures_beside_the_repository(self, monkeypatch):
        """Without the override the folder is ../shared/fixtures from the repository root."""
        monkeypatch.delenv(SHARED_FIXTURES_ENV, raising=False)
        assert shared_fixtures_dir() == (REPO.parent / "shared" / "fixtures").resolve()

    def test_returns_the_recorded_path_in_place(self, monkeypatch, tmp_path):
        """A present fixture is handed back where it lies, not copied."""
        (tmp_path / "kmsg").mkdir()
        (tmp_path / "kmsg" / "a.log").write_text("6,1,2,-;x\n")
        monkeypatch.setenv(SHARED_FIXTURES_ENV, str(tmp_path))
        assert shared_fixture("kmsg/a.log") == tmp_path / "kmsg" / "a.log"
        assert shared_fixture("kmsg") == tmp_path / "kmsg"

    def test_skips_with_the_reason_when_the_folder_is_absent(self, monkeypatch, tmp_path):
        """No ../shared: the test is skipped, and the reason names the fixture and the folder."""
        missing = tmp_path / "no-shared" / "fixtures"
        monkeypatch.setenv(SHARED_FIXTURES_ENV, str(missing))
        with pytest.raises(pytest.skip.Exception, match=r"sysfs/class-infiniband-h100 needs .*no-shared/fixtures"):
            shared_fixture("sysfs/class-infiniband-h100")

    def test_a_missing_entry_in_a_present_folder_fails(self, monkeypatch, tmp_path):
        """A mistyped name fails instead of skipping, so it cannot switch a test off."""
        monkeypatch.setenv(SHARED_FIXTURES_ENV, str(tmp_path))
        with pytest.raises(pytest.fail.Exception, match=r"sonic/nope.json is not in"):
            shared_fixture("sonic/nope.json")
