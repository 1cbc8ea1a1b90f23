"""The agent's half of the probe mesh (issue 29): a responder and a prober over the rails.

``wire`` is the probe format, ``endpoint`` the seam a probe leaves and arrives through (UDP
sockets bound to each rail's address; an RDMA UD queue pair where ``pyverbs`` is present),
``prober`` the one thread that sends on the plan's schedule, answers peers and sums each
flow's loss and round trips over a window for the report (``Report.probe_results``).
"""
