"""The jax.distributed cluster: several processes share one learner mesh (`group`); meeting
and joining them (`rendezvous`, `distributed`, `coordination_service`) and hearing when
one is lost (`peers`)."""
