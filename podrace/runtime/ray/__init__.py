"""The Ray topology: actors as Ray workers on any node of a cluster (`topology`), the
worker's body (`worker`), starting, joining and leaving Ray (`cluster`)."""
