"""The multi-host topology: several processes share one learner mesh (`topology`); meeting
and joining them (`rendezvous`, `distributed`, `coordination_service`) and hearing when
one is lost (`peers`)."""
