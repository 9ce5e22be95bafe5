"""rtserver's benchmark harness (issue 5): load patterns against a running
server, a simulated real-time listener, reports and plots.

``python -m rtserver.tools.bench --help`` (or ``rtserver bench``) runs it. The pure parts
(``stats``, ``listener``, ``measure``, ``corpus``, ``report``) do no I/O.
"""
