"""Ray: this process as a Ray cluster's driver (`driver`), starting, joining and leaving Ray
(`cluster`, the local Ray's processes in `processes`); the Ray-worker fleet (`workers`: the
collector, the restart budget in `restarts`, the data orders and the elastic pipeline
beside it, the worker's body in `worker`) and env workers as Ray actors for the served
fleet (`served`)."""
