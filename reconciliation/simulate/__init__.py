"""The seeded simulator of whole histories (issue 39): every operation, fault and tampering
composed in one history, the invariants after every step, a replayable seed and a shrunk
failing history. ``manage.py simulate`` runs it; docs/simulator.md says how."""
