"""The HTTP app over a registry, its parts as ``tap.build`` gives them, with defaults for tests."""

from twisted.web.resource import Resource

from tests.harness.fakes import FixedProbe
from trapsandbox.admission.auth import Admission
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.mcp.endpoint import McpEndpoint
from trapsandbox.opencode.probe import ProbeResult
from trapsandbox.web.app import GatewayApp
from trapsandbox.web.operator import OperatorRequests


def gateway_app(
    registry, probe=None, admission=None, websocket=None, asks=None, **parts
) -> GatewayApp:
    """
    A ``GatewayApp`` over ``registry``: a healthy probe, no admin token, an
    empty resource at ``/gateway`` unless given; ``parts`` are ``GatewayApp``'s
    (``cluster``, ``operator_socket``, ``managed``).
    """
    admission = Admission(registry.clock) if admission is None else admission
    sandbox = Sandbox(registry)
    return GatewayApp(
        registry,
        FixedProbe(ProbeResult(True)) if probe is None else probe,
        Resource() if websocket is None else websocket,
        OperatorRequests(registry, admission),
        sandbox,
        McpEndpoint(
            registry,
            sandbox,
            registry.metrics,
            before_change=None if asks is None else asks.before_change,
        ),
        registry.metrics,
        asks=asks,
        **parts,
    )
