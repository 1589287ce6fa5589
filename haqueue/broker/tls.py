"""TLS contexts for listeners and for the broker's own outgoing connections, and the user a verified
client certificate names. The engine runs Python's ssl over a MemoryBIO pair per connection
(design/security.md).
"""
from __future__ import annotations

import ssl
from typing import Any

from ..config import TlsConfig


def server_context(tls: TlsConfig, require_client_cert: bool, section: str) -> ssl.SSLContext:
    """A listener's context. With a ca_file, a client certificate is verified against it when presented
    (or always, with `require_client_cert`), and a verified one lets the client log in with SASL EXTERNAL.
    `section` names the config section in errors ("tls", "ha.tls")."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _load(context, tls, section)
    if tls.ca_file:
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


def client_context(tls: TlsConfig, section: str) -> ssl.SSLContext:
    """An outgoing connection's context: present our certificate, and accept a server only with a
    certificate signed by ca_file. Host names are not checked: every holder of a certificate from the
    cluster's CA is a peer, whichever address it answers on (design/security.md)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    _load(context, tls, section)
    return context


def _load(context: ssl.SSLContext, tls: TlsConfig, section: str) -> None:
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except OSError as e:  # ssl.SSLError is one too
        raise OSError(f"{section}: cannot load cert_file {tls.cert_file} with key_file {tls.key_file}: {e}") from None
    if tls.ca_file:
        try:
            context.load_verify_locations(tls.ca_file)
        except OSError as e:
            raise OSError(f"{section}: cannot load ca_file {tls.ca_file}: {e}") from None


def certificate_user(certificate: dict[str, Any] | None) -> str | None:
    """The user a verified peer certificate names: its subject's common name (CN); None without one."""
    for rdn in (certificate or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
