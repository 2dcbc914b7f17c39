from twisted.application.service import ServiceMaker

trapsandbox = ServiceMaker(
    "trapsandbox",
    "trapsandbox.tap",
    "Gateway between CraftOS computers and the sandbox host (opencode).",
    "trapsandbox",
)
