"""
What the browser tests share: a real ``twistd`` gateway (accounts alice and
bob, an admin token), a computer on the Lua harness, and Debian's
``chromium`` driven by Selenium through ``chromedriver``.  Selenium blocks,
so each browser step runs in a thread (``deferToThread``) while the reactor
runs the harness computer; every wait is Selenium's bounded
``WebDriverWait`` on what the page shows.
"""

import os
import shutil

import treq
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.cctweaked import CLIENT_FILES
from tests.harness.craftos import Computer
from tests.harness.processes import REPO, spawn_gateway
from tests.harness.support import accounts_file, bounded, connect, reactor

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # `make test` installs it (the test extras); BrowserCase.start skips
    webdriver = Service = ActionChains = By = Keys = shown = WebDriverWait = None

# What the test modules take from here besides BrowserCase.
__all__ = ["ADMIN_TOKEN", "ActionChains", "BrowserCase", "By", "Keys", "shown"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ADMIN_TOKEN = "admin-token-5678"
ASKER = (
    "term.setTextColour(colours.lime)\nprint('MARKER-42 name?')\n"
    "term.setTextColour(colours.white)\nlocal name = read()\nprint('hello ' .. name)\n"
)
WAIT = 20  # seconds, the bound of every wait on the page


def _browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--window-size=1100,720", "--disable-gpu"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


class BrowserCase(TestCase):
    """The gateway, the browser and the steps the tests take in the page."""

    timeout = 120

    async def start(self, browser=True, **env):
        """The gateway (a real twistd: accounts alice and bob, an admin token; ``env`` added
        to its environment) and a browser."""
        if webdriver is None:
            raise SkipTest("selenium is not installed (pip install -e '.[test]')")
        if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
            raise SkipTest("chromium and chromium-driver are not installed (make chromium)")
        path = accounts_file(self, "alice", "bob")
        env = {"OPENCODE_URL": "", **env}
        child = spawn_gateway(
            self, SANDBOX_ACCOUNTS_FILE=path, SANDBOX_ADMIN_TOKEN=ADMIN_TOKEN, **env
        )
        self.port = await child.listening_port()
        self.base = f"http://127.0.0.1:{self.port}"
        if browser:
            self.driver = await self.thread(_browser)
            self.addCleanup(lambda: deferToThread(self.driver.quit))

    def thread(self, f, *args):
        return bounded(deferToThread(f, *args), WAIT + 10)

    async def alice_computer(self, allow="exec,screen,input"):
        c = Computer(self.mktemp(), id=7, label="si")
        self.addCleanup(c.shutdown)
        for dest, source in CLIENT_FILES.items():
            c.install(os.path.join(REPO, "lua", source), dest)
        url = f"ws://127.0.0.1:{self.port}/gateway"
        c.set_settings(
            {
                "sandbox.url": url,
                "sandbox.password": "s-alice",
                "sandbox.allow": allow,
            }
        )
        c.write_file("/asker.lua", ASKER)
        c.run("/servers/sandbox.lua")
        await c.wait_for_lua("traposSandboxState and traposSandboxState.connected")
        return c

    async def bob_computer(self):
        bob = await connect(self, self.port)
        self.assertEqual((await bob.hello("s-bob", "2:bob"))["payload"], {"accountId": "bob"})
        return bob

    def log_in(self, token):
        """Open the console and give ``token`` (blocking: in a thread)."""
        self.driver.get(self.base + "/")
        field = self.driver.find_element(By.ID, "token")
        label = self.driver.find_element(By.CSS_SELECTOR, "label[for=token]")
        assert (label.text, field.get_attribute("type")) == ("Token", "password")
        field.send_keys(token)
        self.driver.find_element(By.CSS_SELECTOR, "#login button").click()

    def wait_until(self, condition):
        return WebDriverWait(self.driver, WAIT).until(condition)

    def computer_button(self, trapos_id):
        locator = (By.CSS_SELECTOR, f'#computers button[data-trapos="{trapos_id}"]')
        return self.wait_until(shown.element_to_be_clickable(locator))

    def screen_shows(self, text):
        return self.wait_until(shown.text_to_be_present_in_element((By.ID, "screen"), text))

    def execute(self, command):
        pool = HTTPConnectionPool(reactor(), persistent=False)
        return treq.post(
            f"{self.base}/computers/7%3Asi/execute?account=alice",
            json={"command": command, "timeoutMs": 30000},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            pool=pool,
        )

    def text_of(self, element_id):
        return self.driver.find_element(By.ID, element_id).text

    def shows(self, element_id, text):
        """Wait until the element's text holds ``text`` (blocking: in a thread)."""
        return self.wait_until(shown.text_to_be_present_in_element((By.ID, element_id), text))

    def click(self, css):
        self.wait_until(shown.element_to_be_clickable((By.CSS_SELECTOR, css))).click()

    def active_id(self):
        return self.driver.switch_to.active_element.get_attribute("id")

    def no_errors_in_the_page(self):
        """The browser's errors (a CSP violation is one), but for the missing favicon."""
        logs = self.driver.get_log("browser")
        return [e for e in logs if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]]

    async def screenshot(self, variable, element_id=None):
        """Save the page where the environment ``variable`` says (relative to the tree), if it
        is set, scrolled to ``element_id`` first when given: how the pictures in docs/ are made."""
        shot = os.environ.get(variable)
        if not shot:
            return
        if element_id:
            script = f"document.getElementById('{element_id}').scrollIntoView()"
            await self.thread(self.driver.execute_script, script)
        saved = await self.thread(self.driver.save_screenshot, os.path.join(REPO, shot))
        self.assertTrue(saved, shot)
