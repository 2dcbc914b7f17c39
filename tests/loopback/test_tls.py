"""wss:// straight from the gateway, with an ssl: endpoint and a self-signed certificate."""

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import ssl
from twisted.internet.interfaces import ISSLTransport
from twisted.trial.unittest import TestCase

from tests.harness.support import both_modes, connect, start_gateway


def self_signed(directory) -> tuple[str, str, bytes]:
    """A key and certificate for localhost; returns their paths and the certificate PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
    key_path, cert_path = f"{directory}/key.pem", f"{directory}/cert.pem"
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    with open(cert_path, "wb") as f:
        f.write(cert_pem)
    return key_path, cert_path, cert_pem


class TLSTests(TestCase):
    async def test_wss_hello_and_probe(self):
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        key, cert, pem = self_signed(directory)
        gateway = start_gateway(
            self,
            password="sesame",
            ports=(f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}",),
        )
        computer = await connect(self, gateway.port, trust=ssl.Certificate.loadPEM(pem))
        self.assertTrue(ISSLTransport.providedBy(computer.transport))
        reply = await computer.hello("sesame")
        self.assertTrue(reply["ok"], reply)
        reply = await computer.request("probe_gateway")
        self.assertEqual(reply["payload"]["sandboxOk"], True)


both_modes(globals(), "TLSTests")
