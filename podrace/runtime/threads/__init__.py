"""Fleets of this process's actors: actor threads (`actors`, with `LocalActors`, what every
such fleet shares), served actors with env workers and inference threads (`served`); and
the thread group every run's loops run in (`group`)."""
