"""
The SQLite snapshot store's thread never keeps a stopped gateway alive.

A "during shutdown" trigger is not waited for, and a thread's answer reaches the reactor only
while it runs: so a close whose answer comes after the reactor stopped must still end the
thread. Once in a few full runs a real twistd outlived SIGTERM this way (its store finished
opening while the computers were closing; the close it then started answered too late), and
Python waited forever for the idle thread at exit. Each case runs in a child process with the
real reactor and the store's thread held at the worst moment by an event, not a sleep.
"""

import sys

from twisted.trial.unittest import TestCase

from tests.harness.processes import clean_env, spawn

CHILD = r"""
import sys, tempfile, threading
from twisted.internet import reactor
from twisted.logger import globalLogBeginner, textFileLogObserver
from trapsandbox.snapshots.sqlitestore import SqliteStore

globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stdout)])
case = sys.argv[1]
gate = threading.Event()
# Registered before the store's own trigger: the held step goes on while the reactor stops.
reactor.addSystemEventTrigger("during", "shutdown", gate.set)


stores = []


def held(step):
    def run(self):
        stores.append(self)
        assert gate.wait(30), "never released"
        return step(self)
    return run


if case == "stopped-while-opening":
    SqliteStore._open = held(SqliteStore._open)
    SqliteStore.open(tempfile.mkdtemp(), reactor)
    reactor.callWhenRunning(reactor.stop)
else:  # "closed-while-stopping": the close starts in the stop, answers after the loop ended
    SqliteStore._close = held(SqliteStore._close)

    def opened(store):
        # As the gateway's attach does when its store opens after the stop began: the
        # close's Deferred is not what the stop waits for.
        reactor.addSystemEventTrigger("before", "shutdown", lambda: store.close() and None)
        reactor.stop()

    SqliteStore.open(tempfile.mkdtemp(), reactor).addCallback(opened)

reactor.run()
print("threads left:", [t.name for t in threading.enumerate() if t is not threading.main_thread()])
print("stores:", len(stores), "closed:", all(store._db is None for store in stores))
"""


class StoreShutdownTests(TestCase):
    timeout = 60

    async def check(self, case: str) -> None:
        child = spawn(self, [sys.executable, "-c", CHILD, case], clean_env())
        code = await child.wait_ended(20)
        self.assertEqual(code, 0, child.output)
        self.assertIn("threads left: []", child.output)
        self.assertIn("stores: 1 closed: True", child.output)
        self.assertNotIn("Traceback", child.output)

    async def test_a_reactor_stopped_while_the_store_opens(self):
        await self.check("stopped-while-opening")

    async def test_a_close_that_answers_after_the_reactor_stopped(self):
        await self.check("closed-while-stopping")
