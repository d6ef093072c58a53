"""What reaches the terminal: one line and an exit code per fault (`faults`), Ctrl-C
(`interrupts`), which of Dask's log records are shown (`quiet_logs`), and text from a store
with its control characters escaped (`printable`).

The lowest package of `sweep`: the driver, the clusters and the command line all use it.
"""
