"""Who is asking, for tests that send requests to a computer themselves."""

from trapsandbox.computers.callers import GATEWAY_SENDER, Caller, Sender
from trapsandbox.limits import LOCAL_ACCOUNT


def asking(
    trapos_id: str | None, account: str | None = LOCAL_ACCOUNT, sender: Sender = GATEWAY_SENDER
) -> Caller:
    """A caller aimed at ``account``'s ``trapos_id`` (the gateway's own, unless ``sender``)."""
    return Caller(account, trapos_id, sender)


AGENT = Sender("agent")


def mcp_caller(scope: str | None, pin: tuple[str, str] | None = None) -> Caller:
    """What ``/mcp`` makes of its caller: an ask's token pinned to its computer (``pin``),
    else the agent of an operator whose tools reach ``scope``'s computers (None: all)."""
    if pin is not None:
        return Caller(pin[0], pin[1], Sender("ask"))
    return Caller(scope, None, AGENT)
