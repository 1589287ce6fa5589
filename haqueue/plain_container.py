"""A proton Container for haqueue's own blocking clients (AdminClient, the supervisor's requests, `haqueue admin`,
`haqueue diverged`) that builds no SSL contexts.

proton's Container makes a client and a server SSLDomain whenever it is constructed, and OpenSSL loads the
system's CA bundle into each: about 110 ms of CPU per BlockingConnection, even for a plain connection, which
the supervisor paid on every status and promote request of a failover. A client that speaks TLS passes its
own domain (admin._ssl_domain), so the defaults are never needed.
"""
from __future__ import annotations

import uuid
from typing import Any

from proton.reactor import Container
from proton._reactor import GlobalOverrides


class PlainContainer(Container):
    def __init__(self, *handlers: Any) -> None:
        # With `impl` given, proton's Container.__init__ skips its own set-up, SSLConfig() included: the same
        # set-up follows, without the SSL domains (a TLS connection brings its own).
        super().__init__(*handlers, impl=None)
        self.ssl = None  # type: ignore[assignment]  # proton's own value without SSL, as its stub does not say
        # proton's own handler is an IOHandler, as GlobalOverrides wants: its stub types it as any Handler
        self.global_handler = GlobalOverrides(self.global_handler)  # type: ignore[arg-type]
        self.trigger = None
        self.container_id = str(uuid.uuid4())
        self.allow_insecure_mechs = True
        self.allowed_mechs = None
        self.sasl_enabled = True
        self.user = None
        self.password = None
