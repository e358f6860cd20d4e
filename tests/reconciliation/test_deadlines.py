"""One whole-call deadline for every provider call, whatever the framing of its answer
(issue 40): a provider that answers at once and then sends one byte a second is cut at the
tool's timeout, not when it stops. Real trickling servers on 127.0.0.1, one per framing, and
over TLS."""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciliation.providers import transport
from reconciliation.providers.base import Call, SendStatus
from reconciliation.providers.http import GenericHttpAdapter
from tests.reconciliation.bad_provider import TRICKLES

DEADLINE = 0.6
# A cut call ends at its deadline; what is over that is the machine being busy, and is far
# below what a trickle would take (the servers below trickle for 30 s).
SLACK = 1.5


class TricklingServer:
    """Answers every request with ``head`` at once, then ``piece`` every 0.2 s for 30 s."""

    def __init__(self, head: bytes, piece: bytes, *, tls: ssl.SSLContext | None = None) -> None:
        self.head, self.piece, self.tls = head, piece, tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            conn.recv(65536)
            conn.sendall(self.head)
            for _ in range(150):
                if self.stopping.wait(0.2):
                    break
                conn.sendall(self.piece)
        except OSError:
            pass  # the client cut the call: that is the point
        finally:
            conn.close()

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()


def _certificate(workdir: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = workdir / "cert.pem", workdir / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def trickling(request, tmp_path: Path, monkeypatch) -> Iterator[tuple[TricklingServer, str]]:
    framing, tls = request.param
    head, piece = TRICKLES[framing]
    context = None
    scheme = "http"
    if tls:
        cert, key = _certificate(tmp_path)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        # The client trusts this server's certificate as a system one would be trusted.
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        scheme = "https"
    server = TricklingServer(head, piece, tls=context)
    yield server, f"{scheme}://127.0.0.1:{server.port}"
    server.close()


FRAMINGS = [
    ("trickle", False),
    ("trickle_close", False),
    ("trickle_http10", False),
    ("trickle_closedelim", False),
    ("trickle_chunked", False),
    ("trickle_close", True),
    ("trickle_chunked", True),
]
IDS = [f"{name}{'-tls' if tls else ''}" for name, tls in FRAMINGS]


@pytest.mark.parametrize("trickling", FRAMINGS, ids=IDS, indirect=True)
def test_a_trickling_answer_is_cut_at_the_whole_call_deadline_whatever_its_framing(
    trickling,
) -> None:
    _, base = trickling
    started = time.monotonic()
    with pytest.raises(transport.DeadlineExceeded) as cut:
        transport.exchange(
            "GET", f"{base}/lookup", body=None, headers={}, deadline=DEADLINE, max_bytes=1 << 20
        )
    took = time.monotonic() - started
    assert DEADLINE * 0.9 <= took < DEADLINE + SLACK, f"the call took {took:.2f}s"
    # What the cut call reports as its latency is the time it ran.
    assert DEADLINE * 900 <= cut.value.latency_ms <= took * 1000 + 50


class _Tool:
    name = "trickled"
    effect_class = "idempotent"
    timeout_seconds = DEADLINE
    max_sends = 0
    critical = False

    def __init__(self, base: str) -> None:
        self.dispatch_url = f"{base}/send"
        self.lookup_url = f"{base}/lookup"


@pytest.mark.parametrize(
    "trickling", [("trickle_close", False), ("trickle_http10", False)], indirect=True
)
def test_a_send_cut_at_its_deadline_records_the_time_it_ran_not_zero(trickling) -> None:
    _, base = trickling
    adapter = GenericHttpAdapter(_Tool(base))  # type: ignore[arg-type]
    call = Call(
        attempt_id="a1",
        tenant="t",
        tool_name="trickled",
        idempotency_key="k1",
        args_hash="0" * 64,
        args={"x": 1},
    )
    started = time.monotonic()
    answer = adapter.send(call)
    took = time.monotonic() - started
    assert answer.status == SendStatus.UNCERTAIN
    assert "timeout" in answer.detail
    assert took < DEADLINE + SLACK
    assert answer.latency_ms >= DEADLINE * 900
    lookup = adapter.lookup(call)
    assert lookup.latency_ms >= DEADLINE * 900
