"""The parameter-server modes on Ray (seed ``training-through-failure-parameter-servers.txt``):
synchronous and asynchronous servers that restart from their checkpoint, chain replication, and the
stateless server, each recording a transcript that one process audits bit for bit. Only
:mod:`.pool` and :mod:`.faults` import no Ray; the rest is imported where a run starts."""
