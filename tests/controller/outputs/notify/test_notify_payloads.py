"""Alert payload shapes, Alertmanager-compatible fingerprints, webhook signing, and notify config parsing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from controller.detect.model import Incident
from controller.outputs.notify import payloads
from controller.outputs.notify.config import NotifyConfigError, parse_notify_config
from controller.outputs.notify.signing import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
    signed_headers,
    verify,
)

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
OPENED = 1_767_323_045_678  # 2026-01-02T03:04:05.678Z


def incident(**kw: Any) -> Incident:
    base: dict[str, Any] = {
        "id": "inc-000007",
        "kind": "link_fault",
        "root_cause": "node-003/nic-5<->leaf-b0-r5",
        "component_type": "link",
        "affected_nodes": ["node-003"],
        "affected_jobs": ["job-a"],
        "severity": "critical",
        "action": "replace_cable",
        "evidence": [{"rule": "nic_link_flap", "component": "node-003/nic-5", "message": "link flapping", "count": 12}],
        "opened_ms": OPENED,
    }
    base.update(kw)
    return Incident(**base)


class TestLabelsAndFingerprints:
    def test_labels_carry_the_incident_identity(self) -> None:
        labels = payloads.alert_labels(incident())
        assert labels == {
            "alertname": "StarpulseIncident",
            "incident_id": "inc-000007",
            "kind": "link_fault",
            "root_cause": "node-003/nic-5<->leaf-b0-r5",
            "component_type": "link",
            "severity": "critical",
            "action": "replace_cable",
        }

    def test_empty_root_cause_is_left_out(self) -> None:
        """A partition blames no component; Alertmanager treats empty labels as absent."""
        labels = payloads.alert_labels(incident(kind="partition", root_cause="", component_type="network"))
        assert "root_cause" not in labels

    def test_fingerprint_matches_alertmanager(self) -> None:
        """FNV-1a 64 over sorted pairs with 0xff separators, as prometheus/common model.LabelSet.Fingerprint."""
        assert payloads.fingerprint({}) == "cbf29ce484222325"  # the FNV-1a 64 offset basis
        assert payloads.fingerprint({"alertname": "a"}) == payloads.fingerprint({"alertname": "a"})
        assert payloads.fingerprint({"a": "b", "c": "d"}) == payloads.fingerprint({"c": "d", "a": "b"})
        assert payloads.fingerprint({"a": "bc"}) != payloads.fingerprint({"ab": "c"})  # separators matter
        fp = payloads.webhook_alert(incident(), "firing")["fingerprint"]
        assert re.fullmatch(r"[0-9a-f]{16}", fp)
        assert fp == payloads.webhook_alert(incident(evidence=[], affected_nodes=["x", "y"]), "firing")["fingerprint"]
        assert fp != payloads.webhook_alert(incident(severity="fatal"), "firing")["fingerprint"]

    def test_rfc3339_is_utc_with_millis(self) -> None:
        assert payloads.rfc3339(OPENED) == "2026-01-02T03:04:05.678Z"
        assert payloads.rfc3339(0) == "1970-01-01T00:00:00.000Z"

    def test_annotations_are_truncated(self) -> None:
        nodes = [f"node-{i:03d}" for i in range(50)]
        ev = [{"rule": "r", "component": f"c{i}", "message": "m" * 400} for i in range(10)]
        ann = payloads.alert_annotations(incident(affected_nodes=nodes, evidence=ev))
        assert ann["affected_nodes"].startswith("node-000, node-001")
        assert ann["affected_nodes"].endswith("(+30 more)")
        assert len(ann["evidence"]) <= payloads.MAX_ANNOTATION
        assert "critical link_fault on node-003/nic-5<->leaf-b0-r5" in ann["summary"]


class TestWebhookV4:
    def test_firing_payload_has_every_v4_field(self) -> None:
        alert = payloads.webhook_alert(incident(), "firing", "http://ctl:8080")
        body = payloads.alertmanager_webhook_payload("ops", [alert], external_url="http://ctl:8080")
        assert set(body) >= {
            "version",
            "groupKey",
            "truncatedAlerts",
            "status",
            "receiver",
            "groupLabels",
            "commonLabels",
            "commonAnnotations",
            "externalURL",
            "alerts",
        }
        assert body["version"] == "4" and body["status"] == "firing" and body["receiver"] == "ops"
        assert body["truncatedAlerts"] == 0 and body["externalURL"] == "http://ctl:8080"
        assert body["groupLabels"] == {"incident_id": "inc-000007"}
        assert body["commonLabels"] == alert["labels"]
        assert body["commonAnnotations"] == alert["annotations"]
        assert 'incident_id="inc-000007"' in body["groupKey"]
        (a,) = body["alerts"]
        assert set(a) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
        assert a["startsAt"] == "2026-01-02T03:04:05.678Z" and a["endsAt"] == payloads.ZERO_TIME
        assert a["generatorURL"] == "http://ctl:8080/api/incidents/inc-000007"
        json.dumps(body)  # serialisable as is

    def test_resolved_payload(self) -> None:
        inc = incident(resolved_ms=OPENED + 60_000)
        body = payloads.alertmanager_webhook_payload("ops", [payloads.webhook_alert(inc, "resolved")])
        assert body["status"] == "resolved"
        assert body["alerts"][0]["endsAt"] == "2026-01-02T03:05:05.678Z"
        assert RFC3339.match(body["alerts"][0]["startsAt"])

    def test_group_status_is_firing_when_any_alert_fires(self) -> None:
        old = payloads.webhook_alert(incident(severity="warning", resolved_ms=OPENED + 1), "resolved")
        new = payloads.webhook_alert(incident(), "firing")
        body = payloads.alertmanager_webhook_payload("ops", [new, old])
        assert body["status"] == "firing"
        assert "severity" not in body["commonLabels"]  # differs between the two
        assert body["commonLabels"]["incident_id"] == "inc-000007"


class TestApiV2:
    def test_array_of_firing_and_resolved(self) -> None:
        now = OPENED + 10_000
        active = incident()
        done = incident(id="inc-000008", resolved_ms=OPENED + 5_000)
        body = payloads.alertmanager_api_alerts([active, done], now, resend_interval_s=60, external_url="http://c")
        assert isinstance(body, list) and len(body) == 2
        firing, resolved = body
        assert set(firing) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
        assert firing["labels"]["incident_id"] == "inc-000007"
        # firing: endsAt far enough ahead that a late resend does not resolve it
        assert firing["endsAt"] == payloads.rfc3339(now + payloads.RESEND_LIFETIMES * 60_000)
        assert resolved["endsAt"] == payloads.rfc3339(OPENED + 5_000)
        for a in body:
            assert RFC3339.match(a["startsAt"]) and RFC3339.match(a["endsAt"])

    def test_stamp_leaves_resolved_alone_and_does_not_mutate(self) -> None:
        stored = [payloads.api_alert(incident(), "firing")]
        assert "endsAt" not in stored[0]
        stamped = payloads.stamp_api_alerts(stored, OPENED, 1.0)
        assert "endsAt" not in stored[0] and stamped[0]["endsAt"] == payloads.rfc3339(OPENED + 4000)
        again = payloads.stamp_api_alerts(stamped, OPENED + 999_999, 1.0)
        assert again[0]["endsAt"] == stamped[0]["endsAt"]


class TestGeneric:
    def test_generic_body(self) -> None:
        body = payloads.generic_payload(incident(), "firing", "abc", "http://c", previous_severity="warning")
        assert body["status"] == "firing" and body["delivery_id"] == "abc" and body["version"] == "1"
        assert body["incident"]["id"] == "inc-000007" and body["incident"]["resolved_at"] is None
        assert body["incident"]["affected_nodes"] == ["node-003"]
        assert body["previous_severity"] == "warning"
        assert body["fingerprint"] == payloads.fingerprint(payloads.alert_labels(incident()))
        json.dumps(body)


class TestSigning:
    SECRET = "s3cret"
    BODY = b'{"status":"firing"}'
    TS = 1_767_323_045

    def headers(self, secret: str = SECRET, ts: int = TS, body: bytes = BODY) -> dict[str, str]:
        return signed_headers(secret, ts, body, "d-1")

    def test_sign_format_and_input(self) -> None:
        import hashlib
        import hmac

        expected = hmac.new(b"s3cret", f"{self.TS}.".encode() + self.BODY, hashlib.sha256).hexdigest()
        assert sign(self.SECRET, self.TS, self.BODY) == "sha256=" + expected

    def test_headers(self) -> None:
        h = self.headers()
        assert h[TIMESTAMP_HEADER] == str(self.TS) and h[DELIVERY_HEADER] == "d-1"
        assert h[SIGNATURE_HEADER].startswith("sha256=")
        assert signed_headers(None, self.TS, self.BODY, "d-1") == {DELIVERY_HEADER: "d-1"}

    def test_verify_accepts_a_fresh_correct_signature(self) -> None:
        assert verify(self.SECRET, self.headers(), self.BODY, now=self.TS + 10)
        lower = {k.lower(): v for k, v in self.headers().items()}
        assert verify(self.SECRET, lower, self.BODY, now=self.TS)

    def test_wrong_secret(self) -> None:
        assert not verify("other", self.headers(), self.BODY, now=self.TS)

    def test_altered_body(self) -> None:
        assert not verify(self.SECRET, self.headers(), self.BODY + b" ", now=self.TS)

    def test_moved_timestamp(self) -> None:
        """The signature binds the timestamp: re-stamping a captured request breaks it."""
        h = self.headers()
        h[TIMESTAMP_HEADER] = str(self.TS + 100)
        assert not verify(self.SECRET, h, self.BODY, now=self.TS + 100)

    def test_stale_timestamp_is_a_replay(self) -> None:
        assert verify(self.SECRET, self.headers(), self.BODY, now=self.TS + 300)
        assert not verify(self.SECRET, self.headers(), self.BODY, now=self.TS + 301)

    def test_future_timestamp(self) -> None:
        assert not verify(self.SECRET, self.headers(), self.BODY, now=self.TS - 301)

    def test_missing_or_garbled_headers(self) -> None:
        assert not verify(self.SECRET, {}, self.BODY, now=self.TS)
        h = self.headers()
        h[TIMESTAMP_HEADER] = "yesterday"
        assert not verify(self.SECRET, h, self.BODY, now=self.TS)
        h = self.headers()
        h[SIGNATURE_HEADER] = h[SIGNATURE_HEADER].replace("sha256=", "md5=")
        assert not verify(self.SECRET, h, self.BODY, now=self.TS)


class TestConfig:
    def test_full_config(self, tmp_path: Path) -> None:
        (tmp_path / "key").write_text("from-file\n")
        cfg = parse_notify_config(
            {
                "external_url": "http://ctl:8080/",
                "receivers": [
                    {"name": "am", "type": "alertmanager_api", "url": "http://am:9093", "resend_interval_s": 30},
                    {
                        "name": "hook",
                        "type": "webhook",
                        "url": "https://hooks.example/x",
                        "secret_file": "key",
                        "min_severity": "critical",
                        "kinds": ["gpu_fault"],
                        "backoff": {"initial_s": 0.5, "max_s": 60},
                        "max_attempts": 10,
                    },
                ],
            },
            "notify.yaml",
            base_dir=tmp_path,
        )
        assert cfg.external_url == "http://ctl:8080"
        am, hook = cfg.receivers
        assert (
            am.post_url == "http://am:9093/api/v2/alerts"
            and am.resend_interval_s == 30
            and am.min_severity == "warning"
        )
        assert hook.secret == "from-file" and hook.kinds == ["gpu_fault"] and hook.max_attempts == 10
        assert hook.backoff.initial_s == 0.5 and hook.backoff.max_s == 60 and hook.backoff.jitter == 0.2

    def test_routing_by_severity_and_kind(self) -> None:
        cfg = parse_notify_config(
            {
                "receivers": [
                    {"name": "all", "type": "alertmanager_webhook", "url": "http://a", "min_severity": "info"},
                    {"name": "crit", "type": "alertmanager_webhook", "url": "http://b", "min_severity": "critical"},
                    {"name": "gpu", "type": "alertmanager_webhook", "url": "http://c", "kinds": ["gpu_fault"]},
                ]
            }
        )
        assert [r.name for r in cfg.routed(incident(severity="warning"))] == ["all"]
        assert [r.name for r in cfg.routed(incident(severity="fatal"))] == ["all", "crit"]
        assert [r.name for r in cfg.routed(incident(kind="gpu_fault", severity="warning"))] == ["all", "gpu"]

    @pytest.mark.parametrize(
        ("receiver", "message"),
        [
            ({"type": "webhook", "url": "http://x", "secret": "k"}, "receivers[0].name: is required"),
            (
                {"name": "a", "type": "slack", "url": "http://x"},
                "receivers[0].type: must be one of alertmanager_webhook, alertmanager_api, webhook, got 'slack'",
            ),
            ({"name": "a", "type": "webhook", "url": "http://x"}, "receivers[0].secret: a 'webhook' receiver"),
            ({"name": "a", "type": "webhook", "url": "ftp://x", "secret": "k"}, "receivers[0].url"),
            (
                {"name": "a", "type": "alertmanager_api", "url": "http://x", "min_severity": "high"},
                "receivers[0].min_severity: must be one of info, warning, critical, fatal, got 'high'",
            ),
            ({"name": "a", "type": "alertmanager_api", "url": "http://x", "kinds": "gpu"}, "receivers[0].kinds"),
            (
                {"name": "a", "type": "alertmanager_api", "url": "http://x", "timeout": 3},
                "receivers[0].timeout: unknown",
            ),
            (
                {"name": "a", "type": "alertmanager_api", "url": "http://x", "backoff": {"jitter": 2}},
                "receivers[0].backoff.jitter",
            ),
            (
                {"name": "a", "type": "webhook", "url": "http://x", "secret_file": "/nonexistent/key"},
                "receivers[0].secret_file: cannot read",
            ),
        ],
    )
    def test_errors_name_the_key(self, receiver: dict[str, Any], message: str) -> None:
        with pytest.raises(NotifyConfigError, match=re.escape(f"notify.yaml: {message}")):
            parse_notify_config({"receivers": [receiver]}, "notify.yaml")

    def test_duplicate_names(self) -> None:
        r = {"name": "a", "type": "alertmanager_api", "url": "http://x"}
        with pytest.raises(NotifyConfigError, match=r"receivers\[1\]\.name: duplicate"):
            parse_notify_config({"receivers": [r, r]}, "n")

    def test_empty_config(self) -> None:
        assert parse_notify_config(None).receivers == []

    def test_every_error_in_one_run(self) -> None:
        """A file with several errors reports each, one line with the file, the key and what was expected."""
        data = {
            "batch_size": 0,
            "bogus": 1,
            "receivers": [
                {"type": "slack", "url": "ftp://x"},
                {"name": "b", "type": "webhook", "url": "http://x", "backoff": {"jitter": 2}, "headers": {"a": 1}},
            ],
        }
        with pytest.raises(NotifyConfigError) as err:
            parse_notify_config(data, "notify.yaml")
        assert sorted(err.value.errors) == [
            "notify.yaml: batch_size: must be an integer >= 1, got 0",
            "notify.yaml: bogus: unknown key",
            "notify.yaml: receivers[0].name: is required",
            "notify.yaml: receivers[0].type: must be one of alertmanager_webhook, alertmanager_api, webhook, "
            "got 'slack'",
            "notify.yaml: receivers[0].url: must be a string starting with http:// or https://, got 'ftp://x'",
            "notify.yaml: receivers[1].backoff.jitter: must be a number >= 0 and < 1, got 2",
            "notify.yaml: receivers[1].headers: must be a mapping of names to strings, got {'a': 1}",
        ]

    def test_cross_key_checks_report_together(self) -> None:
        r = {"name": "a", "type": "webhook", "url": "http://x"}
        both = {"name": "c", "type": "webhook", "url": "http://x", "secret": "k", "secret_file": "/k"}
        slow = {"name": "d", "type": "webhook", "url": "http://x", "secret": "k", "backoff": {"max_s": 0.5}}
        with pytest.raises(NotifyConfigError) as err:
            parse_notify_config({"receivers": [r, both, slow]}, "n")
        assert err.value.errors == [
            "n: receivers[0].secret: a 'webhook' receiver must be signed (secret or secret_file)",
            "n: receivers[1].secret: give secret or secret_file, not both",
            "n: receivers[2].backoff.max_s: must be >= initial_s (1), got 0.5",
        ]
