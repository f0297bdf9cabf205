"""What keeps a months-long run alive: loss-spike detection, rollbacks and skipped samples,
preemption (SIGTERM/Ctrl-C saves), the hang watchdog, the bad-step guard, silent data
corruption named (a suspect step's recompute, the replicas' parameter fingerprints), the run
folder's lock and start-point checks, and fault injection for tests of all of these."""
