"""Every path a user can give the CLI, under a plain file: one line naming the flag, no traceback (issue 30).

Each case runs the real command as a process. A path under a file (``FILE/x``) can be neither
read nor made, whatever the flag is for: a database, a folder, a socket, a settings, TLS or
token file, a kernel log, an output file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.scan import STARPULSE

SVC = ("--listen", "127.0.0.1:0")
AGENT = ("agent", "--node-id", "n1", "--controller", "127.0.0.1:1", "--backend", "sim")
CLIENT = ("nodes", "--controller", "127.0.0.1:1")

# (command line with BAD where the path goes, the flag the one line must name)
CASES: list[tuple[tuple[str, ...], str]] = [
    (("controller", "--db", "BAD", *SVC, "--http", "127.0.0.1:0"), "--db"),
    (("controller", "--config", "BAD"), "BAD"),
    (("controller", "--fabric", "BAD", *SVC), "--fabric"),
    (("controller", "--rules", "BAD", *SVC), "--rules"),
    (("controller", "--notify", "BAD", *SVC), "--notify"),
    (("controller", "--admin-token-file", "BAD", *SVC), "--admin-token-file"),
    (("controller", "--http-token-file", "BAD", *SVC), "--http-token-file"),
    (("controller", "--tls-ca", "BAD", "--tls-cert", "BAD", "--tls-key", "BAD", *SVC), "--tls-"),
    ((*AGENT, "--state-dir", "BAD"), "--state-dir"),
    ((*AGENT, "--state-dir", "STATE", "--job-socket", "BAD"), "--job-socket"),
    ((*AGENT, "--state-dir", "STATE", "--lldpcli-socket", "BAD"), "--lldpcli-socket"),
    ((*AGENT, "--state-dir", "STATE", "--kmsg", "BAD"), "--kmsg"),
    ((*AGENT, "--state-dir", "STATE", "--mount", "BAD"), "--mount"),
    ((*AGENT, "--state-dir", "STATE", "--sysfs-root", "BAD"), "--sysfs-root"),
    ((*AGENT, "--config", "BAD"), "BAD"),
    (("relay", "--relay-id", "r1", "--controller", "127.0.0.1:1", "--config", "BAD"), "BAD"),
    (("scan", "--backend", "none", "--kmsg", "BAD"), "--kmsg"),
    (("scan", "--backend", "none", "--expect", "BAD"), "--expect"),
    (("scan", "--backend", "none", "--sysfs-root", "BAD"), "--sysfs-root"),
    (("accelerators", "show", "--state-dir", "BAD"), "--state-dir"),
    (("accelerators", "confirm", "--state-dir", "BAD", "--count", "8"), "--state-dir"),
    ((*CLIENT, "--admin-token-file", "BAD"), "--admin-token-file"),
    ((*CLIENT, "--tls-ca", "BAD", "--tls-cert", "BAD", "--tls-key", "BAD"), "--tls-"),
    (("topology", "generate", "--nodes", "4", "--out", "BAD"), "--out"),
    (("topology", "show", "--file", "BAD"), "--file"),
    (("tls", "make-test-ca", "--out", "BAD", "--nodes", "n1"), "--out"),
    (("scenario", "run", "BAD"), "BAD"),
    (("config", "check", "BAD"), "BAD"),
]


@pytest.mark.parametrize(("argv", "flag"), CASES, ids=[" ".join((*a[:1], f)) for a, f in CASES])
def test_a_path_under_a_file_is_one_line_naming_the_flag(tmp_path: Path, argv: tuple[str, ...], flag: str) -> None:
    plain = tmp_path / "plain-file"
    plain.write_text("not a folder\n")
    bad = str(plain / "x")
    args = [a.replace("BAD", bad).replace("STATE", str(tmp_path / "state")) for a in argv]
    proc = subprocess.run([*STARPULSE, *args], capture_output=True, text=True, timeout=60, check=False)
    said = proc.stderr if proc.stderr.strip() else proc.stdout  # `config check` reports on stdout
    lines = [line for line in said.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    # One line, or one per flag when several (all three TLS files) are wrong, each naming its flag.
    assert 1 <= len(lines) <= (3 if flag.startswith("--tls") else 1), said
    assert all(flag.replace("BAD", bad) in line for line in lines), lines
