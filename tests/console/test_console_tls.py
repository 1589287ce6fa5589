"""The console over HTTPS (`http.tls`): served with the configured certificate, its URL in the broker's status;
a client speaking plain HTTP to it gets nothing, and the console serves on."""
from __future__ import annotations

import http.client
import json
import ssl

import pytest

from harness import free_port, run_haqueue
from tls_certs import CertificateAuthority


def _session(port: int, context: ssl.SSLContext) -> dict:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("GET", "/api/session")
        response = conn.getresponse()
        assert response.status == 200
        return json.loads(response.read())
    finally:
        conn.close()


def test_console_over_https(broker_factory, tmp_path):
    ca = CertificateAuthority(tmp_path / "tls", "ca")
    certificate = ca.issue("localhost")
    port = free_port()
    b = broker_factory(http={"listen": f"127.0.0.1:{port}",
                             "tls": {"cert_file": certificate.cert_file, "key_file": certificate.key_file}})
    context = ssl.create_default_context(cafile=ca.ca_file)
    url = f"https://127.0.0.1:{port}/"
    assert _session(port, context)["console"] == url
    status = run_haqueue(["admin", "-b", b.address, "status"])
    assert json.loads(status.stdout)["console"] == url, status.stderr

    plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    with pytest.raises((http.client.HTTPException, OSError)):
        plain.request("GET", "/api/session")
        plain.getresponse()
    plain.close()
    assert _session(port, context)["anonymous"] is True  # still serving
