"""
The console's files panel (issue 34) in a real headless browser
(``tests.browser.browser``): the tree, the editor (CodeMirror, bundled by
``make``), saving and its conflicts, new/rename/delete, upload and download
byte for byte, and what another account's token reaches.

``TRAPSANDBOX_FILES_SCREENSHOT=docs/console-files.png`` saves the panel with a
file open (how ``docs/console-files.png`` was made; relative to the tree).
"""

from pathlib import Path

from tests.browser.browser import ActionChains, BrowserCase, By, Keys, shown
from tests.harness.support import bounded
from trapsandbox import limits

# A binary file of every byte value, over several parts (the upload's progress shows): binary
# ones of 120 KiB to this client (it announces binary_parts).
BINARY = bytes(range(256)) * 1100 + b"\x00\xff\r\n"
# Records every value the files panel's progress bar takes (window.progressShown).
RECORD_PROGRESS = """
window.progressShown = [];
new MutationObserver((changes) => {
  for (const change of changes) window.progressShown.push(change.target.getAttribute("value"));
}).observe(document.getElementById("files-progress"), {attributeFilter: ["value"]});
"""


class FilesTests(BrowserCase):
    """The files panel (issue 34): the tree, the editor, saving, conflicts, transfers."""

    async def files_of_alice(self, allow="exec,fs.read,fs.write,screen"):
        await self.start()
        c = await self.alice_computer(allow=allow)
        c.write_file("/hello.lua", "print('HELLO-1')\n")
        c.write_file("/lib/util.lua", "return {}\n")
        await self.thread(self.log_in, "token-alice")
        await self.thread(self.click, '#computers button[data-trapos="7:si"]')
        await self.thread(self.shows, "files-title", "Files of 7:si")
        return c

    def tree_entry(self, path):
        return f'#file-tree button[data-path="{path}"]'

    def open_file(self, path, text):
        """Click ``path`` in the tree and wait for the editor to show ``text``."""
        self.click(self.tree_entry(path))
        self.shows("file-path", path)
        self.editor_shows(text)

    def editor_content(self):
        """The editor's text area (CodeMirror's, inside the shadow root of #editor)."""
        host = self.driver.find_element(By.ID, "editor")
        return host.shadow_root.find_element(By.CSS_SELECTOR, ".cm-content")

    def editor_shows(self, text):
        self.wait_until(lambda _: text in self.editor_content().text)

    def type_over(self, text):
        """Replace the editor's text by typing ``text`` (select all, then the keys)."""
        self.editor_content().click()
        keys = ActionChains(self.driver).key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL)
        keys.send_keys(text).perform()

    async def test_open_edit_save_see_it_run_and_make_rename_delete(self):
        c = await self.files_of_alice()
        # The tree: sizes, /rom marked, folders listed when opened.
        await self.thread(self.shows, "file-tree", "hello.lua")
        tree = await self.thread(self.text_of, "file-tree")
        self.assertIn("rom ROM", tree)
        self.assertIn("hello.lua 17 B", tree)
        self.assertNotIn("util.lua", tree)
        await self.thread(self.click, self.tree_entry("/lib"))
        await self.thread(self.shows, "file-tree", "util.lua 10 B")
        # Open it in the editor, Lua highlighted; edit; save with Ctrl+S.
        await self.thread(self.open_file, "/hello.lua", "print('HELLO-1')")
        content = await self.thread(self.editor_content)
        spans = await self.thread(content.find_elements, By.CSS_SELECTOR, "span")
        self.assertTrue(spans, "no highlighted token")
        await self.thread(self.type_over, "print('EDITED-77')\n")
        await self.thread(self.shows, "file-state", "edited")
        editor = await self.thread(self.editor_content)
        await self.thread(editor.send_keys, Keys.CONTROL, "s")
        await self.thread(self.shows, "files-status", "Saved /hello.lua")
        self.assertEqual(c.read_file("/hello.lua"), b"print('EDITED-77')\n")
        # The computer runs what was saved: its screen in the page shows it.
        run = self.execute("hello")
        await self.thread(self.screen_shows, "EDITED-77")
        await bounded(run, 30)
        await self.thread(self.shows, "activity", "write_file /hello.lua · ok")
        await self.screenshot("TRAPSANDBOX_FILES_SCREENSHOT", "files-area")
        # New folder, new file in it, rename it, delete it (asked first).
        await self.thread(self.click, "#folder-new")
        await self.thread(self.answer_path, "/work")
        await self.thread(self.shows, "files-status", "Created the folder /work.")
        self.assertTrue((c.root / "work").is_dir())
        await self.thread(self.click, self.tree_entry("/work"))
        await self.thread(self.click, "#file-new")
        field = await self.thread(self.driver.find_element, By.ID, "name-path")
        self.assertEqual(await self.thread(field.get_attribute, "value"), "/work/")
        await self.thread(self.answer_path, "/work/a.lua")
        await self.thread(self.shows, "file-path", "/work/a.lua")  # open in the editor
        self.assertEqual(c.read_file("/work/a.lua"), b"")
        await self.thread(self.click, self.tree_entry("/work/a.lua"))
        await self.thread(self.click, "#file-rename")
        await self.thread(self.answer_path, "/work/b.lua")
        await self.thread(self.shows, "files-status", "Renamed /work/a.lua to /work/b.lua.")
        self.assertIsNone(c.read_file("/work/a.lua"))
        self.assertEqual(c.read_file("/work/b.lua"), b"")
        # A folder is renamed too, with what is in it: one entry in the activity.
        await self.thread(self.click, self.tree_entry("/work"))
        await self.thread(self.click, "#file-rename")
        await self.thread(self.answer_path, "/done")
        await self.thread(self.shows, "files-status", "Renamed /work to /done.")
        self.assertFalse((c.root / "work").exists())
        self.assertEqual(c.read_file("/done/b.lua"), b"")
        await self.thread(self.shows, "activity", "move_file /work \u2192 /done \u00b7 ok")
        await self.thread(self.click, self.tree_entry("/done"))
        await self.thread(self.click, "#file-delete")
        await self.thread(
            self.shows, "files-question", "Delete the folder /done and everything in it"
        )
        self.assertEqual(await self.thread(self.active_id), "files-no")
        await self.thread(self.click, "#files-no")
        self.assertEqual(c.read_file("/done/b.lua"), b"")
        await self.thread(self.click, "#file-delete")
        await self.thread(self.click, "#files-yes")
        await self.thread(self.shows, "files-status", "Deleted /done.")
        self.assertFalse((c.root / "done").exists())
        self.assertEqual(await self.thread(self.no_errors_in_the_page), [])

    def answer_path(self, path):
        field = self.wait_until(shown.visibility_of_element_located((By.ID, "name-path")))
        field.clear()
        field.send_keys(path + Keys.ENTER)

    async def test_a_file_changed_on_the_computer_is_not_overwritten_silently(self):
        c = await self.files_of_alice()
        await self.thread(self.open_file, "/hello.lua", "HELLO-1")
        c.write_file("/hello.lua", "print('THEIRS')\n")
        await self.thread(self.type_over, "print('MINE')\n")
        await self.thread(self.click, "#file-save")
        await self.thread(
            self.shows, "conflict-question", "changed on the computer since you opened it"
        )
        self.assertEqual(c.read_file("/hello.lua"), b"print('THEIRS')\n")
        self.assertEqual(await self.thread(self.active_id), "conflict-keep")
        # Load the computer's: the editor shows it, nothing is written.
        await self.thread(self.click, "#conflict-theirs")
        await self.thread(self.editor_shows, "THEIRS")
        self.assertEqual(c.read_file("/hello.lua"), b"print('THEIRS')\n")
        # Same size, other content: still seen. This time the player overwrites it.
        await self.thread(self.type_over, "print('MINE!!')\n")
        c.write_file("/hello.lua", "print('OTHER!')\n")
        await self.thread(self.click, "#file-save")
        await self.thread(self.shows, "conflict-question", "its content changed (same size)")
        await self.thread(self.click, "#conflict-overwrite")
        await self.thread(self.shows, "files-status", "Saved /hello.lua")
        self.assertEqual(c.read_file("/hello.lua"), b"print('MINE!!')\n")
        # Deleted on the computer: said too, and saving puts it back only when chosen.
        await self.thread(self.type_over, "print('AGAIN')\n")
        (c.root / "hello.lua").unlink()
        await self.thread(self.click, "#file-save")
        await self.thread(self.shows, "conflict-question", "it was deleted")
        self.assertIsNone(c.read_file("/hello.lua"))
        await self.thread(self.click, "#conflict-overwrite")
        await self.thread(self.shows, "files-status", "Saved /hello.lua")
        self.assertEqual(c.read_file("/hello.lua"), b"print('AGAIN')\n")
        self.assertEqual(await self.thread(self.no_errors_in_the_page), [])

    async def test_upload_and_download_a_binary_file_byte_for_byte(self):
        c = await self.files_of_alice()
        downloads = Path(self.mktemp()).resolve()
        downloads.mkdir(parents=True)
        where = {"behavior": "allow", "downloadPath": str(downloads)}
        await self.thread(self.driver.execute_cdp_cmd, "Page.setDownloadBehavior", where)
        source = Path(self.mktemp())
        source.write_bytes(BINARY)
        upload = await self.thread(self.driver.find_element, By.ID, "file-upload")
        # Every value the progress bar shows, as it shows it.
        await self.thread(self.driver.execute_script, RECORD_PROGRESS)
        await self.thread(upload.send_keys, str(source.resolve()))
        await self.thread(self.shows, "files-status", f"Uploaded /{source.name}")
        self.assertTrue(c.read_file("/" + source.name) == BINARY, "not the same bytes")
        # Written in several parts by the gateway, shown as one change by the player.
        written = f"write_file /{source.name}"
        await self.thread(self.shows, "activity", written + " \u00b7 ok")
        activity = await self.thread(self.text_of, "activity")
        self.assertEqual(activity.count(written), 1, activity)
        self.assertIn(written + " \u00b7 ok", activity)
        # In parts, with progress: the bar moved with each part the computer wrote, to the end.
        shown = await self.thread(self.driver.execute_script, "return window.progressShown")
        step = limits.BINARY_PART_BYTES
        parts = [n for n in range(0, len(BINARY), step)][1:] + [len(BINARY)]
        self.assertEqual(list(dict.fromkeys(int(v) for v in shown if int(v) > 0)), parts)
        # Past the request limit: refused in the page, with why, and nothing sent.
        big = source.with_name("big.bin")
        big.write_bytes(b"\0" * (1024 * 1024 + 1))
        await self.thread(upload.send_keys, str(big.resolve()))
        await self.thread(self.shows, "files-error", "the console uploads files up to 1.00 MiB")
        self.assertFalse((c.root / "big.bin").exists())
        # Download it back: the page's bytes, byte for byte.
        c.write_file("/blob.bin", BINARY[::-1])
        await self.thread(self.click, "#files-refresh")
        await self.thread(self.click, self.tree_entry("/blob.bin"))
        await self.thread(self.shows, "files-error", "is not text")
        await self.thread(self.click, "#file-download")
        target = downloads / "blob.bin"
        await self.thread(
            self.wait_until, lambda _: target.exists() and target.stat().st_size == len(BINARY)
        )
        self.assertTrue(target.read_bytes() == BINARY[::-1], "not the same bytes")
        await self.thread(self.shows, "files-status", "Downloaded /blob.bin")
        self.assertEqual(await self.thread(self.no_errors_in_the_page), [])

    async def test_files_need_fs_read_and_another_account_reaches_none(self):
        await self.start()
        await self.alice_computer(allow="exec,screen")
        await self.bob_computer()
        await self.thread(self.log_in, "token-alice")
        await self.thread(self.click, '#computers button[data-trapos="7:si"]')
        await self.thread(self.shows, "files-notice", "Files need fs.read: 7:si has not allowed it")
        self.assertEqual(await self.thread(self.text_of, "file-tree"), "")
        # Bob's token: alice's computer is not listed, and asked by hand it is not found.
        await self.thread(self.log_in, "token-bob")
        await self.thread(self.computer_button, "2:bob")
        script = (
            "const done = arguments[arguments.length - 1];"
            "import('/console/operator.js').then(({operatorRequest}) =>"
            " operatorRequest({traposId: '7:si', accountId: 'alice'}, 'list_files', {path: '/'}))"
            ".then((a) => done([a.status, a.error && a.error.code]));"
        )
        answer = await self.thread(self.driver.execute_async_script, script)
        self.assertEqual(answer, [404, "not_connected"])  # as a computer that is not there
        listed = await self.thread(self.text_of, "computers")
        self.assertNotIn("7:si", listed)
