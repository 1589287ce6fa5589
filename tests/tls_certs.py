"""Certificates for the TLS tests, made with the `openssl` command: a CA, and certificates it signs
(each valid for localhost and 127.0.0.1, as a server and as a client). EC P-256 keys: quick to make."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@dataclass
class Certificate:
    cert_file: str
    key_file: str
    ca_file: str  # the CA that signed it

    def config(self, ca_file: str | None = None) -> dict[str, str]:
        """As a `tls` / `ha.tls` config section, trusting `ca_file` (by default its own CA)."""
        return {"cert_file": self.cert_file, "key_file": self.key_file, "ca_file": ca_file or self.ca_file}


class CertificateAuthority:
    def __init__(self, directory: Path, name: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.ca_file = str(self.directory / f"{name}.pem")
        self._key = str(self.directory / f"{name}.key")
        _openssl("req", "-x509", *KEY, "-subj", f"/CN={name}", "-days", "2", "-keyout", self._key,
                 "-out", self.ca_file, "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def issue(self, common_name: str) -> Certificate:
        """A certificate for subject CN=common_name, signed by this CA."""
        stem = self.directory / f"{self.name}-{common_name}"
        key, csr, cert, ext = (f"{stem}.key", f"{stem}.csr", f"{stem}.pem", f"{stem}.ext")
        Path(ext).write_text("basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
                             "extendedKeyUsage=serverAuth,clientAuth\n")
        _openssl("req", *KEY, "-subj", f"/CN={common_name}", "-keyout", key, "-out", csr)
        _openssl("x509", "-req", "-in", csr, "-CA", self.ca_file, "-CAkey", self._key, "-CAcreateserial",
                 "-days", "2", "-extfile", ext, "-out", cert)
        return Certificate(cert, key, self.ca_file)
