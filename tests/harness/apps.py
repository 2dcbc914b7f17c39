"""The HTTP app as the daemon assembles it (``tap.web_app``), with defaults for tests."""

from twisted.web.resource import Resource

from tests.harness.fakes import FixedProbe
from trapsandbox.admission.auth import Admission
from trapsandbox.opencode.probe import ProbeResult
from trapsandbox.tap import web_app
from trapsandbox.web.app import GatewayApp
from trapsandbox.web.operator import OperatorRequests


def gateway_app(registry, probe=None, admission=None, websocket=None, **parts) -> GatewayApp:
    """
    A ``GatewayApp`` over ``registry``: a healthy probe, no admin token, an
    empty resource at ``/gateway`` unless given; ``parts`` are ``web_app``'s
    (``asks``, ``cluster``, ``operator_socket``).
    """
    admission = Admission(registry.clock) if admission is None else admission
    return web_app(
        registry,
        FixedProbe(ProbeResult(True)) if probe is None else probe,
        Resource() if websocket is None else websocket,
        OperatorRequests(registry, admission),
        registry.metrics,
        **parts,
    )
