"""The test CA, the peer identity rule, clear errors for bad TLS and token files, the CLI helpers."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from starpulse.app import cli
from starpulse.core.auth import AuthConfig, AuthConfigError, Denied, check_admin, load_tokens, token_matches
from starpulse.core.names import InvalidName
from starpulse.core.tls import (
    TestCA,
    TLSConfigError,
    TLSSettings,
    load_channel_credentials,
    load_material,
    load_server_credentials,
    make_test_ca,
    node_id_from_auth,
    peer_node_id,
)


@pytest.fixture(autouse=True)
def _keep_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.main() points logging at the (captured, later closed) stderr; keep the test's config."""
    monkeypatch.setattr("starpulse.core.logs.configure_logging", lambda *a, **k: None)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return make_test_ca(tmp_path_factory.mktemp("pki"), ["node-000", "node-001"], ("ctl.example", "10.0.0.5"))


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


class TestMakeTestCA:
    def test_files_and_modes(self, ca: TestCA) -> None:
        out = ca.ca_cert.parent
        names = {p.name for p in out.iterdir()}
        assert names == {
            f"{stem}.{ext}" for stem in ("ca", "controller", "admin", "node-000", "node-001") for ext in ("pem", "key")
        }
        for p in out.iterdir():
            mode = stat.S_IMODE(p.stat().st_mode)
            assert mode == (0o600 if p.suffix == ".key" else 0o644), (p.name, oct(mode))

    def test_names_and_sans(self, ca: TestCA) -> None:
        root = _cert(ca.ca_cert)
        assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        ctl = _cert(ca.controller.cert_file)
        san = ctl.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == ["ctl.example"]
        assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
        eku = ctl.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert ExtendedKeyUsageOID.SERVER_AUTH in eku
        for node, settings in ca.nodes.items():
            cert = _cert(settings.cert_file)
            assert _cn(cert) == node
            assert cert.issuer == root.subject
            uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert uris.get_values_for_type(x509.UniformResourceIdentifier) == [f"starpulse-node:{node}"]
            assert (
                ExtendedKeyUsageOID.CLIENT_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
            )
        assert _cn(_cert(ca.admin.cert_file)) == "admin"

    def test_credentials_load(self, ca: TestCA) -> None:
        assert isinstance(load_server_credentials(ca.controller), grpc.ServerCredentials)
        assert isinstance(load_channel_credentials(ca.nodes["node-000"]), grpc.ChannelCredentials)

    @pytest.mark.parametrize("nodes", [["node-0; rm -rf /"], ["../../etc"], ["admin"], ["controller"], ["a", "a"]])
    def test_refuses_bad_node_names(self, tmp_path: Path, nodes: list[str]) -> None:
        with pytest.raises((InvalidName, ValueError)):
            make_test_ca(tmp_path, nodes)
        assert not list(tmp_path.glob("*.key"))

    def test_cli_make_test_ca(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        out = tmp_path / "pki"
        rc = cli.main(
            [
                "tls",
                "make-test-ca",
                "--out",
                str(out),
                "--nodes",
                "node-000,node-001",
                "--controller-host",
                "ctl.example",
            ]
        )
        assert rc == 0, capsys.readouterr().err
        assert (out / "node-001.pem").exists() and (out / "admin.key").exists()
        san = _cert(out / "controller.pem").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == ["ctl.example"]
        rc = cli.main(["tls", "make-test-ca", "--out", str(tmp_path / "x"), "--nodes", "bad;name"])
        assert rc == 2
        assert "invalid node id" in capsys.readouterr().err


class TestPeerIdentity:
    """URI SAN starpulse-node:<id>, else a single DNS SAN, else the CN; always a valid node id."""

    def test_uri_san_wins(self) -> None:
        auth = {"peer_uri": [b"starpulse-node:node-007"], "peer_dns": [b"other"], "x509_common_name": [b"cn-node"]}
        assert node_id_from_auth(auth) == "node-007"

    def test_uri_from_san_list_when_peer_uri_absent(self) -> None:
        assert node_id_from_auth({"x509_subject_alternative_name": [b"starpulse-node:n1"]}) == "n1"

    def test_conflicting_uris_name_nobody(self) -> None:
        auth = {"peer_uri": [b"starpulse-node:a", b"starpulse-node:b"], "x509_common_name": [b"a"]}
        assert node_id_from_auth(auth) is None

    def test_single_dns_san_then_cn(self) -> None:
        assert node_id_from_auth({"peer_dns": [b"node-3"], "x509_common_name": [b"node-9"]}) == "node-3"
        assert node_id_from_auth({"peer_dns": [b"a", b"b"], "x509_common_name": [b"node-9"]}) == "node-9"
        assert node_id_from_auth({"x509_common_name": [b"node-9"]}) == "node-9"

    def test_invalid_names_are_no_identity(self) -> None:
        assert node_id_from_auth({"x509_common_name": [b"node-0; rm -rf /"]}) is None
        assert node_id_from_auth({"peer_uri": [b"starpulse-node:../../etc"]}) is None
        assert node_id_from_auth({}) is None

    def test_peer_node_id_needs_tls(self) -> None:
        class Ctx:
            def __init__(self, auth: dict[str, list[bytes]]) -> None:
                self.auth = auth

            def auth_context(self) -> dict[str, list[bytes]]:
                return self.auth

        assert peer_node_id(Ctx({})) is None
        assert peer_node_id(Ctx({"transport_security_type": [b"insecure"], "x509_common_name": [b"n"]})) is None
        assert peer_node_id(Ctx({"transport_security_type": [b"ssl"]})) is None  # TLS, no client certificate
        ok = {"transport_security_type": [b"ssl"], "x509_common_name": [b"node-1"]}
        assert peer_node_id(Ctx(ok)) == "node-1"


class TestFileErrors:
    def _settings(self, ca: TestCA, **over: Path) -> TLSSettings:
        base = ca.nodes["node-000"]
        return TLSSettings(
            ca_file=over.get("ca_file", base.ca_file),
            cert_file=over.get("cert_file", base.cert_file),
            key_file=over.get("key_file", base.key_file),
        )

    def test_missing_file_is_named(self, ca: TestCA, tmp_path: Path) -> None:
        missing = tmp_path / "nope.pem"
        with pytest.raises(TLSConfigError, match=r"certificate file .*nope\.pem.* does not exist"):
            load_material(self._settings(ca, cert_file=missing))

    def test_not_pem_is_named(self, ca: TestCA, tmp_path: Path) -> None:
        junk = tmp_path / "junk.pem"
        junk.write_text("hello\n")
        with pytest.raises(TLSConfigError, match=r"CA file .*junk\.pem.* not a PEM"):
            load_material(self._settings(ca, ca_file=junk))
        with pytest.raises(TLSConfigError, match=r"key file .*junk\.pem.* not an unencrypted PEM"):
            load_material(self._settings(ca, key_file=junk))

    def test_empty_and_directory(self, ca: TestCA, tmp_path: Path) -> None:
        empty = tmp_path / "empty.key"
        empty.write_bytes(b"")
        with pytest.raises(TLSConfigError, match="is empty"):
            load_material(self._settings(ca, key_file=empty))
        with pytest.raises(TLSConfigError, match="not a regular file"):
            load_material(self._settings(ca, key_file=tmp_path))

    def test_key_that_does_not_match(self, ca: TestCA) -> None:
        wrong = ca.nodes["node-001"].key_file
        with pytest.raises(TLSConfigError, match=r"node-001\.key.* does not match certificate .*node-000\.pem"):
            load_server_credentials(self._settings(ca, key_file=wrong))

    def test_cli_bad_tls_file_is_one_line(self, ca: TestCA, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        rc = cli.main(
            [
                "nodes",
                "--controller",
                "127.0.0.1:1",
                "--tls-ca",
                str(ca.ca_cert),
                "--tls-cert",
                str(tmp_path / "gone.pem"),
                "--tls-key",
                str(ca.admin.key_file),
            ]
        )
        assert rc == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "gone.pem" in err[0] and "does not exist" in err[0]

    def test_cli_tls_flags_go_together(self) -> None:
        args = cli.build_parser().parse_args(["agent", "--node-id", "n", "--tls-ca", "ca.pem"])
        with pytest.raises(ValueError, match="go together"):
            cli.tls_settings(args)


class _Ctx:
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def auth_context(self) -> dict[str, Any]:
        return {}


class TestAdminTokens:
    TOKEN = "t" * 20

    def test_config_rules(self) -> None:
        with pytest.raises(AuthConfigError):
            AuthConfig(admin_tokens=[])
        with pytest.raises(AuthConfigError):
            AuthConfig(admin_tokens=["short"])
        with pytest.raises(AuthConfigError):
            AuthConfig(open_reads=False)  # nobody could read
        assert AuthConfig().admin_open

    def test_check(self) -> None:
        cfg = AuthConfig(admin_tokens=[self.TOKEN, "u" * 20])
        assert check_admin(cfg, _Ctx([("authorization", f"Bearer {'u' * 20}")])) == "token"
        for meta, code in (
            ([], grpc.StatusCode.UNAUTHENTICATED),
            ([("authorization", self.TOKEN)], grpc.StatusCode.UNAUTHENTICATED),
            ([("authorization", "Bearer nope-nope-nope-nope")], grpc.StatusCode.PERMISSION_DENIED),
        ):
            with pytest.raises(Denied) as denied:
                check_admin(cfg, _Ctx(meta))
            assert denied.value.code == code
            assert self.TOKEN not in denied.value.message

    def test_token_matches(self) -> None:
        assert token_matches(self.TOKEN, ["x" * 20, self.TOKEN])
        assert not token_matches(self.TOKEN[:-1], [self.TOKEN])
        assert not token_matches("é" * 20, [self.TOKEN])

    def test_load_tokens(self, tmp_path: Path) -> None:
        f = tmp_path / "tokens"
        f.write_text(f"# admins\n\n{self.TOKEN}\n  {'v' * 20}  \n")
        assert load_tokens(f) == [self.TOKEN, "v" * 20]
        f.write_text("# nothing\n")
        with pytest.raises(AuthConfigError, match="holds no token"):
            load_tokens(f)
        with pytest.raises(AuthConfigError, match="cannot be read"):
            load_tokens(tmp_path / "missing")

    def test_cli_client_token(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        parser = cli.build_parser()
        monkeypatch.setenv(cli.ADMIN_TOKEN_ENV, "from-env-token-123456")
        assert cli.client_token(parser.parse_args(["jobs"])) == "from-env-token-123456"
        f = tmp_path / "t"
        f.write_text(self.TOKEN + "\n")
        assert cli.client_token(parser.parse_args(["jobs", "--admin-token-file", str(f)])) == self.TOKEN
        monkeypatch.delenv(cli.ADMIN_TOKEN_ENV)
        assert cli.client_token(parser.parse_args(["jobs"])) is None

    def test_cli_controller_auth(self, tmp_path: Path) -> None:
        f = tmp_path / "t"
        f.write_text(self.TOKEN + "\n")
        argv = ["controller", "--admin-token-file", str(f), "--require-read-token", "--admin-cert-name", "admin"]
        args = cli.build_parser().parse_args(argv)
        args.argv = argv
        from starpulse.app.config.controller import load_controller_config

        cfg = load_controller_config(None, {}, cli.overrides(args)).auth
        assert cfg.admin_tokens == [self.TOKEN] and not cfg.open_reads and cfg.admin_cert_names == ["admin"]
