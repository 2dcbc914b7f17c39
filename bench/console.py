"""
Key-to-screen latency in the web console itself (SPEC §14's target: p50 ≤ 100 ms), in a
real headless browser (Debian's ``chromium`` through Selenium's ``chromedriver``), against
a gateway that runs and a computer already connected::

    python -m bench.console --url http://127.0.0.1:4444 --token T --computer 0: [--presses 40]

The benchmark logs in to the console with the token, opens the computer, starts a program
that waits in ``read()`` (``/bench-read.lua``, written and run through the HTTP API: the
computer must allow exec, fs.write, screen and input) and types into the console's
terminal.  Both ends of each figure are taken in the page, on its clock: the ``keydown``
the console's own handler receives, and the moment its terminal's text shows the key
(a ``MutationObserver`` on it).  So the figure is what the operator sees: the key's way
through the page, ``/operator``, the gateway, the computer's event loop, ``read()``'s
redraw, the screen watch and the page's drawing.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import string
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

from bench.harness import percentile
from bench.live import LINE, PACE, READER

WAIT = 15.0  # seconds, the bound of every wait

# In the page: the time of each key's keydown, and of the terminal first showing `want`.
INSTRUMENT = """
const screen = document.getElementById("screen");
window.benchTimes = [];
window.benchWant = null;
window.benchKeyAt = null;
screen.addEventListener("keydown", () => { window.benchKeyAt = performance.now(); }, true);
new MutationObserver(() => {
  if (window.benchWant !== null && screen.textContent.includes(window.benchWant)) {
    window.benchTimes.push(performance.now() - window.benchKeyAt);
    window.benchWant = null;
  }
}).observe(screen, {subtree: true, childList: true, characterData: true});
"""


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--window-size=1100,720", "--disable-gpu"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(options=options, service=Service(driver))


class Gateway:
    """The gateway's operator HTTP API, for what the benchmark does outside the page."""

    def __init__(self, url: str, token: str | None, computer: str, account: str | None):
        self.url, self.token = url.rstrip("/"), token
        query = f"?account={urllib.parse.quote(account)}" if account else ""
        self.base = f"{self.url}/computers/{urllib.parse.quote(computer, safe='')}"
        self.query = query

    def post(self, route: str, body: dict[str, Any], seconds: float = WAIT) -> bytes:
        request = urllib.request.Request(
            self.base + route + self.query,
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.token}"} if self.token else {}),
            },
        )
        with urllib.request.urlopen(request, timeout=seconds) as response:
            return response.read()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait

    gateway = Gateway(args.url, args.token, args.computer, args.account)
    content = base64.b64encode(READER.encode()).decode()
    gateway.post(
        "/write-file", {"path": "/bench-read.lua", "content": content, "encoding": "base64"}
    )
    driver = _browser()
    try:
        wait = WebDriverWait(driver, WAIT)
        driver.get(gateway.url + "/")
        driver.find_element(By.ID, "token").send_keys(args.token or "")
        driver.find_element(By.CSS_SELECTOR, "#login button").click()
        button = (By.CSS_SELECTOR, f'#computers button[data-trapos="{args.computer}"]')
        wait.until(shown.element_to_be_clickable(button)).click()
        screen = driver.find_element(By.ID, "screen")
        driver.execute_script(INSTRUMENT)
        typed_total = 0
        while typed_total < args.presses:
            # A round: the program waits in read(); up to LINE keys, then Enter ends it.
            run = threading.Thread(
                target=gateway.post,
                args=("/execute", {"command": "/bench-read.lua", "timeoutMs": 120000}, 130),
            )
            run.start()
            wait.until(shown.text_to_be_present_in_element((By.ID, "screen"), "BENCH> "))
            typed = ""
            for _ in range(min(LINE, args.presses - typed_total)):
                time.sleep(PACE)  # keys apart, as a person types: no frame held by coalescing
                char = random.choice(string.ascii_letters)
                typed += char
                driver.execute_script("window.benchWant = arguments[0];", "BENCH> " + typed)
                screen.send_keys(char)
                wait.until(lambda d: d.execute_script("return window.benchWant === null;"))
                typed_total += 1
            screen.send_keys(Keys.ENTER)
            run.join(WAIT)
        times = driver.execute_script("return window.benchTimes;")
    finally:
        driver.quit()
    return {
        "presses": len(times),
        "p50_ms": round(percentile(times, 0.5), 1),
        "p95_ms": round(percentile(times, 0.95), 1),
        "max_ms": round(max(times), 1),
        "path": "keydown in the console -> the key shown in its terminal (in the page)",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.console",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="the running gateway")
    parser.add_argument("--token", default=os.environ.get("SANDBOX_ADMIN_TOKEN"))
    parser.add_argument("--computer", required=True, help="the computer's traposId")
    parser.add_argument("--account", help="with the admin token: the computer's account")
    parser.add_argument("--presses", type=int, default=40, help="keys timed (40)")
    args = parser.parse_args(argv)
    print(json.dumps({"console_latency": measure(args)}, indent=2))


if __name__ == "__main__":
    main()
