"""The committed generated code is exactly what protoc makes from proto/."""

from __future__ import annotations

import filecmp
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "tools" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestGeneratedCode:
    def test_committed_code_matches_a_fresh_generation(self, tmp_path: Path) -> None:
        """Regenerating into a temp folder gives byte-identical files: nobody edited generated code by hand."""
        generated = _load_generator().generate(tmp_path)
        assert generated, "protoc produced nothing"
        for path in generated:
            committed = ROOT / path.relative_to(tmp_path)
            assert committed.exists(), f"{committed.name} is generated but not committed"
            assert filecmp.cmp(path, committed, shallow=False), f"{committed.name} differs: run tools/gen_proto.py"
        committed_files = {p.name for p in (ROOT / "starpulse" / "v1").glob("*_pb2*.py*")}
        assert committed_files == {p.name for p in generated}, "stale generated files are committed"
