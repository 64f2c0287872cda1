"""What every component process shares: its context on the log (producers, codec, metrics, dead
letters), topic names, attaching to a run, the schema store on the log, the transactional outbox
and where a run's base checkpoint lives."""
