"""
Each benchmark run tiny, end to end, so it cannot rot: ``make bench`` runs these first (they
only check that every scenario ran and its counts add up; a shared machine is too noisy for
figures at this size).  ``make test`` leaves them out: they are the benchmarks' own checks,
and take a minute.
"""
