"""
The web console (SPEC §14) in a real headless browser: Debian's ``chromium``
driven by Selenium through ``chromedriver``, against a real ``twistd`` and a
computer on the Lua harness.  Selenium blocks, so each browser step runs in a
thread (``deferToThread``) while the reactor runs the harness computer; every
wait is Selenium's bounded ``WebDriverWait`` on what the page shows.

``TRAPSANDBOX_CONSOLE_SCREENSHOT=docs/console.png`` saves the console beside
the running program (how ``docs/console.png`` was made; relative to the tree);
``TRAPSANDBOX_SNAPSHOTS_SCREENSHOT=F`` saves it showing a snapshot's changes.
"""

import argparse

import orjson
import treq
from twisted.internet.threads import deferToThread
from twisted.web.client import HTTPConnectionPool

from bench import console
from tests.browser.browser import ADMIN_TOKEN, BrowserCase, By, Keys, shown
from tests.harness.support import bounded, reactor


class ConsoleTests(BrowserCase):
    async def test_log_in_watch_a_computer_type_into_read_and_see_it_leave(self):
        await self.start()
        c = await self.alice_computer()
        await self.bob_computer()
        await self.thread(self.log_in, "token-alice")
        button = await self.thread(self.computer_button, "7:si")
        await self.thread(button.click)
        # The screen as the daemon left it (its activity is watched from then on), then the
        # marker a program prints, drawn as text in the page.
        await self.thread(self.screen_shows, "allowed: exec, screen, input")
        run = self.execute("asker")
        await self.thread(self.screen_shows, "MARKER-42 name?")
        # Typing goes to the program waiting in read().
        screen = await self.thread(self.driver.find_element, By.ID, "screen")
        await self.thread(screen.send_keys, "Ada" + Keys.ENTER)
        await self.thread(self.screen_shows, "hello Ada")
        response = await bounded(run, 30)
        lines = (await bounded(treq.content(response))).splitlines()
        result = orjson.loads(lines[-1])  # the NDJSON stream's last line
        self.assertEqual((result["type"], result["exitCode"]), ("result", 0), lines)
        # CraftOS's colours: the marker in lime (blit 5) on black (f).
        cell = '//*[@id="screen"]/span/span[contains(., "MARKER-42")]'
        marker = await self.thread(self.driver.find_element, By.XPATH, cell)
        self.assertEqual(await self.thread(marker.get_attribute, "class"), "f5 bf")
        # The activity: the exec with its command line and outcome.
        await self.thread(
            self.wait_until,
            shown.text_to_be_present_in_element((By.ID, "activity"), "exec asker · ok · "),
        )
        # ... and who sent it: the admin's token (an account's would be named).
        activity = await self.thread(lambda: self.driver.find_element(By.ID, "activity").text)
        self.assertRegex(activity, r"exec asker · ok · \d+ ms — operator")
        await self.screenshot("TRAPSANDBOX_CONSOLE_SCREENSHOT")
        # The screen is text: its label, no live region, and colours from the palette.
        attributes = await self.thread(
            lambda: (screen.get_attribute("aria-label"), screen.get_attribute("aria-live"))
        )
        self.assertEqual(attributes, ("Terminal of computer 7:si", "off"))
        notice = await self.thread(lambda: self.driver.find_element(By.ID, "notice").text)
        self.assertEqual(notice, "")
        # Alice's token shows alice's computer only.
        listed = await self.thread(lambda: self.driver.find_element(By.ID, "computers").text)
        self.assertNotIn("2:bob", listed)
        # The computer leaves: the console says so.
        await c.shutdown()
        await self.thread(
            self.wait_until,
            shown.text_to_be_present_in_element((By.ID, "notice"), "7:si disconnected"),
        )
        self.assertEqual(await self.thread(self.no_errors_in_the_page), [])

    async def test_take_a_snapshot_see_a_change_and_its_diff_and_restore_it(self):
        """SPEC §15 in the console: take, change a file on the computer, compare, restore."""
        await self.start()
        c = await self.alice_computer(allow="fs.read,fs.write,screen")
        c.write_file("/notes.txt", "one\ntwo\n")
        await self.thread(self.log_in, "token-alice")
        await self.thread(self.click, '#computers button[data-trapos="7:si"]')
        await self.thread(self.shows, "snapshots-title", "Snapshots of 7:si")
        await self.thread(self.shows, "snapshots-status", "No snapshot of this computer yet.")
        await self.thread(self.click, "#take-snapshot")
        await self.thread(self.shows, "snapshots-status", "Snapshot 1 taken")
        await self.thread(self.shows, "snapshots", "taken by an operator")
        # The computer changes: one file modified, one added (sizes differ: the listing sees it).
        c.write_file("/notes.txt", "one\n<b>TWO</b>\n")
        c.write_file("/added.txt", "new")
        await self.thread(self.click, '#snapshots tr[data-snapshot="1"] button')
        await self.thread(self.shows, "changes-summary", "1 added, 1 modified, 0 deleted")
        changes = await self.thread(self.text_of, "changes")
        self.assertIn("modified /notes.txt (8 B → 15 B)", changes)
        self.assertIn("added /added.txt (3 B)", changes)
        # The diff is the computer's text, shown as text (no element made of it).
        diff = await self.thread(self.text_of, "diffs")
        self.assertIn("-two\n+<b>TWO</b>", diff)
        bold = await self.thread(self.driver.find_elements, By.CSS_SELECTOR, "#diffs b")
        self.assertEqual(bold, [])
        await self.screenshot("TRAPSANDBOX_SNAPSHOTS_SCREENSHOT", "snapshots-area")
        # Restore asks first, inline: the safe choice has the focus and Escape backs out.
        await self.thread(self.click, "#restore")
        await self.thread(self.shows, "restore-question", "files created since are deleted")
        self.assertEqual(await self.thread(self.active_id), "restore-no")
        await self.thread(lambda: self.driver.switch_to.active_element.send_keys(Keys.ESCAPE))
        await self.thread(
            self.wait_until, shown.invisibility_of_element_located((By.ID, "restore-confirm"))
        )
        self.assertEqual(await self.thread(self.active_id), "restore")
        self.assertEqual(c.read_file("/notes.txt"), b"one\n<b>TWO</b>\n")
        await self.thread(self.click, "#restore")
        await self.thread(self.click, "#restore-yes")
        await self.thread(self.shows, "restore-result", "Restored snapshot 1.")
        result = await self.thread(self.text_of, "restore-result")
        self.assertIn("Written 1: /notes.txt. Deleted 1: /added.txt.", result)
        self.assertIn("just before are snapshot 2: restore it to undo this", result)
        # Back on the computer, and nothing left to undo against snapshot 1.
        self.assertEqual(c.read_file("/notes.txt"), b"one\ntwo\n")
        self.assertIsNone(c.read_file("/added.txt"))
        await self.thread(self.shows, "changes-summary", "No changes")
        await self.thread(self.shows, "snapshots", "before a restore")
        # One taken elsewhere (trapsandbox-ctl, an ask) is in the activity: the list follows.
        pool = HTTPConnectionPool(reactor(), persistent=False)
        taken = await bounded(
            treq.post(
                f"{self.base}/computers/7%3Asi/snapshots?account=alice",
                json={},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                pool=pool,
            )
        )
        self.assertEqual(taken.code, 200)
        await bounded(treq.content(taken))
        row = (By.CSS_SELECTOR, '#snapshots tr[data-snapshot="3"]')
        await self.thread(self.wait_until, shown.presence_of_element_located(row))
        activity = await self.thread(self.text_of, "activity")
        self.assertIn("snapshot manual · ok", activity)
        self.assertNotIn("read_file", activity)
        self.assertEqual(await self.thread(self.no_errors_in_the_page), [])

    async def test_another_account_sees_its_own_computer_read_only(self):
        await self.start()
        await self.alice_computer()
        await self.bob_computer()
        await self.thread(self.log_in, "token-bob")
        button = await self.thread(self.computer_button, "2:bob")
        listed = await self.thread(lambda: self.driver.find_element(By.ID, "computers").text)
        self.assertNotIn("7:si", listed)
        await self.thread(button.click)
        await self.thread(
            self.wait_until,
            shown.text_to_be_present_in_element((By.ID, "notice"), "Read-only: 2:bob"),
        )
        # No fs.read: the snapshots say what to allow, and nothing can be taken.
        await self.thread(self.shows, "snapshots-notice", "Snapshots need fs.read: 2:bob has not")
        self.assertIn(
            '"sandbox allow fs.read"', await self.thread(self.text_of, "snapshots-notice")
        )
        take = await self.thread(self.driver.find_element, By.ID, "take-snapshot")
        self.assertFalse(await self.thread(take.is_enabled))

    async def test_a_wrong_token_is_refused_with_why(self):
        await self.start()
        await self.thread(self.log_in, "not-a-token")
        await self.thread(
            self.wait_until,
            shown.text_to_be_present_in_element((By.ID, "status"), "refused: wrong bearer token"),
        )
        # The token was never in a URL.
        url = await self.thread(lambda: self.driver.current_url)
        self.assertEqual(url, self.base + "/")

    async def test_the_latency_benchmark_times_keys_in_the_page(self):
        """``python -m bench.console``, tiny: keys typed in the console reach read() and back."""
        await self.start(browser=False)
        await self.alice_computer(allow="exec,fs.write,screen,input")
        args = argparse.Namespace(
            url=self.base, token=ADMIN_TOKEN, computer="7:si", account="alice", presses=3
        )
        figures = await bounded(deferToThread(console.measure, args), 90)
        self.assertEqual(figures["presses"], 3)
        self.assertTrue(0 < figures["p50_ms"] <= figures["max_ms"] < 15000, figures)

    async def test_a_stopped_computer_has_a_badge_says_why_and_is_watched_again_on_resume(self):
        await self.start()
        c = await self.alice_computer()
        await self.thread(self.log_in, "token-alice")
        button = await self.thread(self.computer_button, "7:si")
        await self.thread(button.click)
        await self.thread(self.screen_shows, "allowed: exec, screen, input")
        await c.run("/programs/sandbox.lua stop").done
        badge = (By.CSS_SELECTOR, '#computers button[data-trapos="7:si"] .stopped')
        shown_badge = await self.thread(self.wait_until, shown.visibility_of_element_located(badge))
        self.assertEqual(await self.thread(lambda: shown_badge.text), "stopped")
        await self.thread(
            self.wait_until,
            shown.text_to_be_present_in_element((By.ID, "notice"), "Stopped by its player: "),
        )
        notice = await self.thread(lambda: self.driver.find_element(By.ID, "notice").text)
        self.assertIn('run "sandbox resume"', notice)
        self.assertIn("screen, typing and requests are refused", notice)
        await c.run("/programs/sandbox.lua resume").done
        await self.thread(self.wait_until, shown.invisibility_of_element_located(badge))
        # The stop ended the screen watch on the computer: the console watches again.
        run = self.execute("asker")
        await self.thread(self.screen_shows, "MARKER-42 name?")
        notice = await self.thread(lambda: self.driver.find_element(By.ID, "notice").text)
        self.assertEqual(notice, "")
        await c.shutdown()
        await bounded(run, 30)
