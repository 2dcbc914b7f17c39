"""The bytes of files on their way to each computer (``computers.filebudget``)."""

from twisted.internet.defer import CancelledError
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.computers.filebudget import FileBudget

A = ("local", "7:a")
B = ("local", "8:b")


class FileBudgetTests(SynchronousTestCase):
    def setUp(self):
        self.budget = FileBudget(10)

    def test_what_does_not_fit_waits_in_the_order_asked(self):
        order = []
        self.successResultOf(self.budget.take(A, 6))
        for size in (5, 1, 4):  # the 1 would fit now, but does not pass the 5
            self.budget.take(A, size).addCallback(lambda _, size=size: order.append(size))
        self.assertEqual(order, [])
        self.budget.give(A, 6)
        self.assertEqual(order, [5, 1, 4])
        self.assertEqual(self.budget.held(A), 10)

    def test_computers_have_budgets_of_their_own(self):
        self.successResultOf(self.budget.take(A, 10))
        self.successResultOf(self.budget.take(B, 10))
        self.assertNoResult(self.budget.take(A, 1))

    def test_one_larger_than_the_budget_goes_once_nothing_else_is_out(self):
        self.successResultOf(self.budget.take(A, 25))
        waiting = self.budget.take(A, 1)
        self.assertNoResult(waiting)
        self.budget.give(A, 25)
        self.successResultOf(waiting)
        large = self.budget.take(A, 25)
        self.assertNoResult(large)
        self.budget.give(A, 1)
        self.successResultOf(large)

    def test_a_cancelled_wait_gives_up_its_place_and_nothing_is_left_held(self):
        self.successResultOf(self.budget.take(A, 8))
        first = self.budget.take(A, 5)
        second = self.budget.take(A, 2)  # fits, but waits behind the first
        self.assertNoResult(second)
        first.cancel()
        self.failureResultOf(first, CancelledError)
        self.successResultOf(second)
        self.budget.give(A, 8)
        self.budget.give(A, 2)
        self.assertEqual(self.budget.held(A), 0)
        self.assertEqual((self.budget._held, self.budget._waiting), ({}, {}))
