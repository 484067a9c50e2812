"""What the join listener presents, read as a booting machine's curl sees it."""

from __future__ import annotations

import socket
import ssl

from swarm_autoscaler.adapters.join_tls import pin_of_certificate


def served_pin(port: int) -> str:
    """The pin of the key the join listener at 127.0.0.1:`port` presents in its handshake (the
    certificate is self-signed: the boot's curl --pinnedpubkey checks this, not a CA)."""
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, unverified.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return pin_of_certificate(der)
